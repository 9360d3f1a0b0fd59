"""The benchmarks, the one training loop and the tools around it.

  registry, task, config, data   the contract between a benchmark and the loop: benchmarks by
                                 name, what a suite builds, configs as data, what data looks like
  main, flags                    the command line of `./run.sh <benchmark>` (and of the verbs
                                 that take one: ablate, sweep)
  resnet/, transformer/, ssd/, lm/   one folder per benchmark: config, suite, model, data
  common/                        what benchmarks share (layers, tokenizer, corpora, weights)
  loop/                          the training loop and what it is made of
  pod/                           compile-only pod programs and Google's v0.6 results
  sweep/                         `./run.sh sweep` and `./run.sh ablate`
  perf/                          `./run.sh perf`
"""
