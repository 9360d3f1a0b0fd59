"""Pod work, on a machine without the pod: programs compiled for a TPU slice and what they cost.

  compile_only   a benchmark's train and eval steps compiled for a slice (libtpu), their memory,
                 FLOPs, collectives and the step-time model's prediction (`--compile_only`)
  compile_cache  compiled programs' facts kept while config and code are unchanged
  points         runs to predict, as data (`points/`: Google's MLPerf v0.6 TPU-v3 submissions)
  google_v06     Google's v0.6 submissions derived from their logs (writes `points/`)
  scale          predicted steps and minutes beside measured ones (`./run.sh scale`)
"""
