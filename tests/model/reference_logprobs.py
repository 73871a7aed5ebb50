#!/usr/bin/env python3
"""The NumPy oracle of crescent's logprobs (model/logprobs.h): log_softmax of rows of logits, in float64.

    reference_logprobs.py LOGITS_BIN VOCAB OUT_BIN

LOGITS_BIN holds rows of VOCAB little-endian float32 logits; OUT_BIN gets, row for row, VOCAB little-endian
float64 log-probabilities. reference_llama.py --log-softmax uses the same function on its own logits.
"""
import sys

import numpy as np


def log_softmax(x):
    """Row-wise log(softmax(x)) = x - max - log(sum(exp(x - max))), the max taken out for range."""
    shifted = x - x.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def main():
    logits_path, vocab, out_path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    rows = np.fromfile(logits_path, dtype="<f4").astype(np.float64).reshape(-1, vocab)
    log_softmax(rows).astype("<f8").tofile(out_path)


if __name__ == "__main__":
    main()
