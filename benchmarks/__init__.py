"""The benchmarks and their contract with the harness.

  registry, task, config, data   the contract: benchmarks by name, what a suite builds and
                                 declares, configs as data, what data looks like to the loop
  resnet/, transformer/, ssd/, lm/, llama/   one folder per benchmark: config (its presets),
                                 suite, model, data
  common/                        what benchmarks share (layers, tokenizer, corpora, weights)
"""
