#!/usr/bin/env python3
"""An independent statement of crescent's block-key contract (src/kv/block_key.h), for tests.

Reads JSON from stdin: {"tokens": [...], "block_size": B, "seed": S, "prefix": "kv/"}.
Prints {"full": [keys of the full blocks], "shipped": [full keys + the partial block's key],
"pool": [pool key strings of the full blocks]} as decimal strings.

key[i] = xxh3_64(the block's token ids as little-endian int64, seed = key[i-1]), key[-1] = S.
"""
import json
import struct
import sys

import xxhash


def chain(parent, tokens):
    return xxhash.xxh3_64_intdigest(struct.pack("<%dq" % len(tokens), *tokens), seed=parent)


def main():
    req = json.load(sys.stdin)
    tokens, block, seed = req["tokens"], req["block_size"], req["seed"]
    full, parent = [], seed
    for start in range(0, len(tokens) - block + 1, block):
        parent = chain(parent, tokens[start:start + block])
        full.append(parent)
    shipped = list(full)
    if len(full) * block < len(tokens):
        shipped.append(chain(full[-1] if full else seed, tokens[len(full) * block:]))
    print(json.dumps({"full": [str(k) for k in full], "shipped": [str(k) for k in shipped],
                      "pool": ["%s%016x" % (req["prefix"], k) for k in full]}))


if __name__ == "__main__":
    main()
