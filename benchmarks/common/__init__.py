"""What benchmarks share: layers, tokenizer, corpora and weight loading. No benchmark imports
another benchmark; both import from here."""
