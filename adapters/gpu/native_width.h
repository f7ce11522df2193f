/* How a compiled library of adapters/gpu picks the vector width its kernels run at. */
#ifndef HELIOS_NATIVE_WIDTH_H
#define HELIOS_NATIVE_WIDTH_H

/* `wanted` when the CPU runs it (the library's `scalar` width, 8 or 16 lanes), else `most`, the
 * widest the CPU runs; 0 asks without changing `*chosen` (0 until first use). */
static inline int pick_width(int wanted, int scalar, int most, int *chosen) {
    if (wanted == scalar || (wanted == 8 && most >= 8) || (wanted == 16 && most >= 16))
        *chosen = wanted;
    else if (wanted != 0 || *chosen == 0)
        *chosen = most;
    return *chosen;
}

#endif
