"""Process plumbing: how a meshperf process starts, fails and ends.

  errors     UserError, the errors that end a run with their own status, the exit statuses
  backend    the jax backend: simulated CPU devices, XLA's flags, starting it, device memory
  host       this machine: meshperf's cache folder, the host memory it can give (no jax)
  multihost  starting every process together and ending them together
  tpu_flags  libtpu's flags (LIBTPU_INIT_ARGS)
  scratch    temporary folders that a killed process's successor cleans up
"""
