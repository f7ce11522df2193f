/* repr's text of a logprob that is an FP32 value widened to a double, written without Python
 * floats (included by logprob_json.c).
 *
 * The wire writes a logprob as Python's repr writes the widened double: the fewest significant
 * digits that read back to that double, the nearest such digits when several do, in fixed
 * notation from the logprob floor up to -1e-4. An FP32 value there is m * 2^-s with m in
 * [2^23, 2^24) and s in [10, 37], so it is exactly N * 10^-s with N = m * 5^s < 2^110: the
 * digits are found in 128-bit integers. The double's neighbours lie half an ulp, 5^s / 2^30
 * units of 10^-s, either side (a quarter below a power of two); no decimal with fewer digits
 * than N can sit exactly on that bound (5^s is odd), so "reads back" is a strict comparison.
 * tests/integration/http/test_logprob_json.py compares the text with repr over whole binades.
 */
#ifndef HELIOS_FLOAT_TEXT_H
#define HELIOS_FLOAT_TEXT_H

#include <stdint.h>
#include <string.h>

typedef unsigned __int128 u128;

/* Longest text: "-0.000" and 17 digits, or "-9999." and 13 more digits. */
#define FLOAT_TEXT_MAX 32

/* 5^s and 10^k up to the largest this range needs, built once. */
static u128 FIVES[38];
static u128 TENS[39];

static void float_text_init(void)
{
    FIVES[0] = 1;
    for (int s = 1; s < 38; s++) {
        FIVES[s] = FIVES[s - 1] * 5;
    }
    TENS[0] = 1;
    for (int k = 1; k < 39; k++) {
        TENS[k] = TENS[k - 1] * 10;
    }
}

/* Writes repr(-x) for the FP32 value whose magnitude has these bits, when the value lies in
 * [-9999, -1e-4]'s binades (s in [10, 37]); returns its length, or 0 for a value outside
 * them, which the caller declines. The caller checks the range on the double itself. */
static int float_text(uint32_t magnitude_bits, char *out)
{
    int exponent = (int)(magnitude_bits >> 23);
    int s = 150 - exponent;
    if (s < 10 || s > 37) {
        return 0;
    }
    uint32_t m = (magnitude_bits & 0x7FFFFFu) | 0x800000u;
    u128 n = (u128)m * FIVES[s];
    /* Digits of n: log10(n) is log10(m) + s * log10(5), log10(m) in [6.92, 7.23), so this
     * count is never too many and at most two short. */
    int length = 7 + (s * 69897) / 100000;
    while (n >= TENS[length]) {
        length++;
    }
    /* The nearest decimal of `level` digits lies within the double's neighbours; 17 always
     * do. q is the digits at the level, r what lies below them, unit the last digit's weight
     * (all in units of 10^-s). */
    u128 above = FIVES[s] >> 30;
    u128 below = m == 0x800000u ? FIVES[s] >> 31 : above;
    int level = length < 17 ? length : 17;
    u128 unit = TENS[length - level];
    uint64_t q = (uint64_t)(n / unit);
    u128 r = n - (u128)q * unit;
    uint64_t digits = 0;
    u128 digits_unit = 0;
    for (;;) {
        int down = r <= below;
        int up = unit - r <= above;
        if (!down && !up) {
            break;
        }
        if (down && up) {
            u128 rest = unit - r;
            up = rest < r || (rest == r && (q & 1));
        }
        digits = up ? q + 1 : q;
        digits_unit = unit;
        if (q == 0) {
            break;
        }
        r += (u128)(q % 10) * unit;
        q /= 10;
        unit *= 10;
    }
    if (digits_unit == 0) {
        return 0; /* unreachable: 17 digits always read back */
    }
    /* The value is digits * digits_unit * 10^-s; trailing zeros go to the exponent. */
    int power = 0; /* digits_unit = 10^power */
    while (TENS[power] != digits_unit) {
        power++;
    }
    while (digits % 10 == 0) {
        digits /= 10;
        power++;
    }
    char text[24];
    int count = 0;
    while (digits) {
        text[count++] = (char)('0' + digits % 10);
        digits /= 10;
    }
    /* text holds the digits backwards; the point sits `point` digits after the first. */
    int point = count + power - s;
    int at = 0;
    out[at++] = '-';
    if (point <= 0) {
        out[at++] = '0';
        out[at++] = '.';
        for (int zero = 0; zero < -point; zero++) {
            out[at++] = '0';
        }
        for (int i = count - 1; i >= 0; i--) {
            out[at++] = text[i];
        }
    } else if (point >= count) {
        for (int i = count - 1; i >= 0; i--) {
            out[at++] = text[i];
        }
        for (int zero = 0; zero < point - count; zero++) {
            out[at++] = '0';
        }
        out[at++] = '.';
        out[at++] = '0';
    } else {
        for (int i = count - 1; i >= 0; i--) {
            out[at++] = text[i];
            if (count - i == point) {
                out[at++] = '.';
            }
        }
    }
    return at;
}

#endif
