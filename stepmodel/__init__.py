"""What compiled programs cost, and the hardware they are priced on.

  accelerators  the one table of accelerators (TPU generations, GPUs), the machines the
                hardware presets are made for, and the compilers' flags presets set
  topology      TPU slices by name, as compile-only devices (libtpu)
  hlo           the reader of compiled HLO text
  kernels       each kernel of a compiled TPU program with its FLOPs and HBM bytes
  cost          a compiled step's FLOPs, bytes, memory and collectives
  steptime      the step-time model of a compiled program on a TPU slice
"""
