"""CPU tests of the torch adapter (adapters/gpu); Triton kernels run in its interpreter here."""
