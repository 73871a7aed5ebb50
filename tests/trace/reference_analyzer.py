#!/usr/bin/env python3
"""Independent reference for `crescent analyze`'s prefix-reuse numbers (README "Definitions").

Written from the definitions, not from the C++ code: a request's hit is the leading run of its hash_ids present
in the cache before the request is seen; hit tokens = min(run * block_size, input_length); hit ratio = hit
tokens / input tokens. A capacity point is an LRU cache of max(1, C // block_size) blocks; after each lookup
the request's blocks are touched so that its first block ends up the most recent and its last the least (a
request's tail is evicted first), and absent blocks are stored first to last, never evicting a block of the
same request (a request longer than the cache keeps its head).

Where the ceiling's hits come from (src/trace/stats.h): block j of a request holds min(block_size,
input_length - j * block_size) tokens. A request's prefix root is its key at index min(root_blocks, len(keys)) - 1;
per root: requests, reused tokens (its requests' ceiling hit tokens), their share of all of them, common blocks
(the longest common prefix of its requests' keys), the hit tokens within those blocks, and the deepest hit in
blocks; roots with reused tokens are listed most reused first, ties by smaller key. A block's origin is the
session of the first request holding it; a hit block is within the session when the request's session is its
origin, across sessions when both have sessions that differ, unattributed otherwise.

Traces with token_ids (`--keys-from-tokens`) are re-keyed here by the block-key recurrence (key[i] =
xxh3_64(block's token ids as little-endian int64, seed = key[i-1]), key[-1] = 0, the partial tail keyed the
same way; tests/kv/reference_block_keys.py), with python3-xxhash.

The optimal curve is Belady's MIN rule under the same definitions: after each lookup the request's distinct keys
are stored first to last; when the cache is full, the cached key whose next request (the next request holding it)
is farthest goes, ties to the key stored last; when the key being stored would be that one, it and the rest of
the request are not stored. An unbounded cache's optimum is the ceiling. On the shipped traces it is checked to be never below LRU.

Usage:
  reference_analyzer.py TRACE [CAPACITY_TOKENS...]   one JSON object: ceiling and hit ratio per capacity
  reference_analyzer.py --check CRESCENT TRACE...     compares `CRESCENT analyze --json` with this reference on
                                                      the given traces and on random small traces, some with
                                                      sessions, some with token ids analysed at block sizes 16,
                                                      64 and 512 (exit 1 on a difference above 1e-12)
"""
import bisect
import gzip
import heapq
import json
import os
import random
import struct
import subprocess
import sys
import tempfile
from collections import OrderedDict


def open_trace(path):
    with open(path, "rb") as f:
        magic = f.read(2)
    return gzip.open(path, "rt", encoding="utf-8-sig") if magic == b"\x1f\x8b" else open(
        path, "rt", encoding="utf-8-sig")


def hit_tokens(input_length, keys, cached, block_size):
    """Tokens of a request covered by the leading run of its keys found in `cached`."""
    run = 0
    while run < len(keys) and keys[run] in cached:
        run += 1
    return min(run * block_size, input_length)


def lru_hits(requests, capacity_blocks, block_size):
    cache = OrderedDict()  # key -> None, least recently used first
    hit = 0
    for input_length, keys in requests:
        hit += hit_tokens(input_length, keys, cache, block_size)
        touched = []
        seen = set()
        for key in keys:
            if key in seen:
                continue
            if key in cache:
                del cache[key]  # held out of the LRU order until the request is done
            elif len(cache) + len(touched) >= capacity_blocks:
                if not cache:
                    continue  # nothing but this request's blocks: skip
                cache.popitem(last=False)
            seen.add(key)
            touched.append(key)
        for key in reversed(touched):
            cache[key] = None  # the first key is put back last: most recent
    return hit


def optimal_hits(requests, capacity_blocks, block_size):
    holders = {}  # key -> ascending indices of the requests holding it
    for i, (_, keys) in enumerate(requests):
        for key in dict.fromkeys(keys):
            holders.setdefault(key, []).append(i)

    def next_use(key, i):
        later = holders[key]
        at = bisect.bisect_right(later, i)
        return later[at] if at < len(later) else float("inf")

    cache = {}  # key -> (next use, order stored)
    heap = []  # (-next use, -order, key); entries that no longer match `cache` are stale
    order = 0
    hit = 0
    for i, (input_length, keys) in enumerate(requests):
        hit += hit_tokens(input_length, keys, cache, block_size)
        for key in dict.fromkeys(keys):
            entry = (next_use(key, i), order)
            order += 1
            if key not in cache and len(cache) >= capacity_blocks:
                while cache.get(heap[0][2]) != (-heap[0][0], -heap[0][1]):
                    heapq.heappop(heap)
                if -heap[0][0] <= entry[0]:
                    break  # the key being stored would go first: store no more of this request
                del cache[heapq.heappop(heap)[2]]
            cache[key] = entry
            heapq.heappush(heap, (-entry[0], -entry[1], key))
    return hit


def chain(parent, tokens):
    import xxhash  # python3-xxhash (scripts/install-deps.sh)
    return xxhash.xxh3_64_intdigest(struct.pack("<%dq" % len(tokens), *tokens), seed=parent)


def token_keys(tokens, block_size, seed=0):
    """Every block's key, the partial tail's too: ceil(len(tokens) / block_size) keys."""
    keys, parent = [], seed
    for start in range(0, len(tokens), block_size):
        parent = chain(parent, tokens[start:start + block_size])
        keys.append(parent)
    return keys


def read_full(path, block_size=512, keys_from_tokens=False):
    """(input_length, keys, session or None) per request."""
    requests = []
    with open_trace(path) as f:
        for line in f:
            if line.strip():
                r = json.loads(line)
                keys = token_keys(r["token_ids"], block_size) if keys_from_tokens else r["hash_ids"]
                requests.append((r["input_length"], keys, r.get("session_id")))
    return requests


def read(path):
    return [(n, keys) for n, keys, _ in read_full(path)]


def block_tokens(input_length, j, block_size):
    return max(0, min(block_size, input_length - j * block_size))


def reuse_sources(requests, block_size, root_blocks):
    """Prefix roots and the split within / across sessions of the ceiling's hits, from the definitions."""
    origin = {}  # key -> session of the first request holding it
    by_root = {}  # root key -> [(input_length, keys, run)]
    split = {"within": 0, "across": 0, "unattributed": 0}
    reused = 0
    for input_length, keys, session in requests:
        run = 0
        while run < len(keys) and keys[run] in origin:
            tokens = block_tokens(input_length, run, block_size)
            o = origin[keys[run]]
            split["unattributed" if session is None or o is None else
                  "within" if o == session else "across"] += tokens
            run += 1
        reused += min(run * block_size, input_length)
        for key in keys:
            origin.setdefault(key, session)
        if keys:
            by_root.setdefault(keys[min(root_blocks, len(keys)) - 1], []).append((input_length, keys, run))
    roots = []
    for key, members in by_root.items():
        root_reused = sum(min(run * block_size, n) for n, _, run in members)
        if root_reused == 0:
            continue
        common = len(members[0][1])
        for _, keys, _ in members:
            common = min(common, len(keys))
            common = next((i for i in range(common) if keys[i] != members[0][1][i]), common)
        roots.append({"root_key": key, "requests": len(members), "reused_tokens": root_reused,
                      "reused_share": root_reused / reused, "common_blocks": common,
                      "common_reused_tokens": sum(block_tokens(n, j, block_size) for n, _, run in members
                                                  for j in range(min(run, common))),
                      "deepest_hit_blocks": max(run for _, _, run in members)})
    roots.sort(key=lambda r: (-r["reused_tokens"], r["root_key"]))
    total = sum(n for n, _, _ in requests)
    sessions = None
    with_session = [s for _, _, s in requests if s is not None]
    if with_session:
        sessions = {"sessions": len(set(with_session)), "requests_with_session": len(with_session),
                    "within_session_tokens": split["within"], "across_sessions_tokens": split["across"],
                    "unattributed_tokens": split["unattributed"],
                    "within_session_input_share": split["within"] / total,
                    "across_sessions_input_share": split["across"] / total,
                    "within_session_reused_share": split["within"] / reused if reused else None,
                    "across_sessions_reused_share": split["across"] / reused if reused else None,
                    "unattributed_input_share": split["unattributed"] / total,
                    "unattributed_reused_share": split["unattributed"] / reused if reused else None}
    return {"reused_tokens": reused, "distinct_roots": len(by_root), "roots_with_reuse": len(roots),
            "top_roots": roots, "sessions": sessions}


def reference(path, capacities, block_size=512, keys_from_tokens=False, root_blocks=1):
    full = read_full(path, block_size, keys_from_tokens)
    requests = [(n, keys) for n, keys, _ in full]
    total = sum(n for n, _ in requests)
    seen = set()
    ceiling = 0
    for input_length, keys in requests:
        ceiling += hit_tokens(input_length, keys, seen, block_size)
        seen.update(keys)
    out = {"requests": len(requests), "reuse_ceiling": ceiling / total, "hit_ratio_by_capacity": []}
    out.update(reuse_sources(full, block_size, root_blocks))
    for c in capacities:
        blocks = max(1, c // block_size)
        out["hit_ratio_by_capacity"].append(
            {"capacity_tokens": c, "hit_ratio": lru_hits(requests, blocks, block_size) / total,
             "optimal_hit_ratio": optimal_hits(requests, blocks, block_size) / total})
    return out


def random_trace(path, rng, sessions=False):
    """Requests drawn from a few shared documents (prefix reuse), with random tails, repeated keys inside a
    request, and lengths from one block to several times the smallest caches; with `sessions`, most requests
    in one of a few sessions."""
    documents = [[rng.randrange(1 << 64) for _ in range(rng.randint(1, 12))] for _ in range(4)]
    with open(path, "w") as f:
        for i in range(300):
            doc = rng.choice(documents)
            keys = doc[:rng.randint(0, len(doc))] + [rng.randrange(40) for _ in range(rng.randint(0, 6))]
            if not keys:
                keys = [rng.randrange(40)]
            input_length = 512 * (len(keys) - 1) + rng.randint(1, 512)
            line = {"timestamp": i * 10, "input_length": input_length, "output_length": rng.randint(1, 50),
                    "hash_ids": keys}
            if sessions and rng.random() < 0.85:
                line["session_id"] = rng.randrange(6)
            f.write(json.dumps(line) + "\n")


def random_token_trace(path, rng):
    """A trace as `crescent trace import --keep-tokens` writes it: sessions that each extend their own
    conversation (a shared system prompt, then turns), some requests quoting a shared document; hash_ids at 512
    tokens by the recurrence."""
    system = [rng.randrange(50000) for _ in range(rng.randint(0, 700))]
    documents = [[rng.randrange(50000) for _ in range(rng.randint(1, 1500))] for _ in range(3)]
    history = {}
    with open(path, "w") as f:
        for i in range(80):
            session = rng.randrange(8)
            tokens = history.get(session, list(system))
            if rng.random() < 0.3:
                tokens = tokens + rng.choice(documents)
            tokens = tokens + [rng.randrange(50000) for _ in range(rng.randint(1, 400))]
            answer = [rng.randrange(50000) for _ in range(rng.randint(0, 100))]
            history[session] = tokens + answer
            f.write(json.dumps({"timestamp": i * 10, "input_length": len(tokens),
                                "output_length": rng.randint(1, 50), "hash_ids": token_keys(tokens, 512),
                                "session_id": session, "token_ids": tokens}) + "\n")


def compare(path, got, expected, chained, failures):
    """Differences between crescent's JSON and the reference's, printed; returns the new failure count."""
    pairs = [("requests", got["requests"], expected["requests"]),
             ("reuse_ceiling", got["reuse_ceiling"], expected["reuse_ceiling"])]
    for g, e in zip(got["hit_ratio_by_capacity"], expected["hit_ratio_by_capacity"]):
        pairs.append((f"hit_ratio@{e['capacity_tokens']}", g["hit_ratio"], e["hit_ratio"]))
        pairs.append((f"optimal_hit_ratio@{e['capacity_tokens']}", g["optimal_hit_ratio"],
                      e["optimal_hit_ratio"]))
        # On chained keys MIN is never below LRU. On the random traces' unchained keys it can be at a few
        # blocks (a stored key after a missing one can still hit there); not checked.
        if chained and e["optimal_hit_ratio"] < e["hit_ratio"] - 1e-12:
            print(f"{path}: the optimum is below LRU at {e['capacity_tokens']}")
            failures += 1
    for name in ("reused_tokens", "distinct_roots", "roots_with_reuse"):
        pairs.append((name, got[name], expected[name]))
    if len(got["top_roots"]) != len(expected["top_roots"]):
        print(f"{path}: {len(got['top_roots'])} roots listed, reference {len(expected['top_roots'])}")
        failures += 1
    for i, (g, e) in enumerate(zip(got["top_roots"], expected["top_roots"])):
        pairs += [(f"top_roots[{i}].{name}", g[name], e[name]) for name in e]
    if (got["sessions"] is None) != (expected["sessions"] is None):
        print(f"{path}: sessions: crescent {got['sessions']}, reference {expected['sessions']}")
        failures += 1
    elif expected["sessions"] is not None:
        pairs += [(f"sessions.{name}", got["sessions"][name], e) for name, e in expected["sessions"].items()]
    for name, g, e in pairs:
        if (g is None) != (e is None) or (e is not None and abs(g - e) > 1e-12):
            print(f"{path}: {name}: crescent {g}, reference {e}")
            failures += 1
    return failures


def run_crescent(crescent, args):
    run = subprocess.run([crescent, "analyze", "--json"] + args, capture_output=True, text=True)
    if run.returncode != 0:
        print(f"{' '.join(args)}: crescent failed: {run.stderr.strip()}")
        return None
    return json.loads(run.stdout)


def check(crescent, traces):
    capacities = [512, 1024, 2048, 5000, 20000, 1_000_000, 3_000_000, 10_000_000, 50_000_000]
    failures = 0
    runs = 0
    chained = set(traces)  # real traces: their keys chain (a key implies its request's earlier keys)
    token_traces = []
    with tempfile.TemporaryDirectory() as tmp:
        rng = random.Random(8)
        for n in range(20):
            path = os.path.join(tmp, f"random{n}.jsonl")
            random_trace(path, rng, sessions=n % 2 == 1)
            traces.append(path)
        for n in range(6):
            path = os.path.join(tmp, f"tokens{n}.jsonl")
            random_token_trace(path, rng)
            token_traces.append(path)
        # (trace, extra crescent flags, reference arguments): every trace with its hash_ids, every root listed;
        # the shipped traces also with roots of 2 blocks (on the conversation trace every request starts with
        # the same block), the token traces re-keyed at 16, 64 and 512 tokens a block.
        cases = [(path, [], {}) for path in traces + token_traces]
        cases += [(path, ["--root-blocks", "2"], {"root_blocks": 2}) for path in chained]
        cases += [(path, ["--keys-from-tokens", "--block-size", str(b)],
                   {"block_size": b, "keys_from_tokens": True}) for path in token_traces for b in (16, 64, 512)]
        cases += [(path, ["--root-blocks", "3", "--keys-from-tokens", "--block-size", "64"],
                   {"block_size": 64, "keys_from_tokens": True, "root_blocks": 3})
                  for path in token_traces[:2]]
        for path, flags, kwargs in cases:
            block_size = kwargs.get("block_size", 512)
            # Capacities of whole blocks at 16 tokens would be many; the curve at 512 is checked on them all.
            sizes = capacities if block_size == 512 else [c for c in capacities if c <= 20000]
            expected = reference(path, sizes, **kwargs)
            got = run_crescent(crescent, flags + ["--top-roots", "1000000", "--capacities",
                                                  ",".join(str(c) for c in sizes), path])
            runs += 1
            if got is None:
                failures += 1
                continue
            failures = compare(f"{path} {' '.join(flags)}", got, expected, path in chained, failures)
        # Re-keyed at the block size of their hash_ids, by the same recurrence, token traces analyse exactly as
        # their hash_ids do.
        for path in token_traces:
            from_ids = run_crescent(crescent, [path])
            from_tokens = run_crescent(crescent, ["--keys-from-tokens", path])
            runs += 2
            if from_ids is None or from_tokens is None:
                failures += 1
                continue
            from_tokens["keys_from_token_ids"] = False
            if from_ids != from_tokens:
                print(f"{path}: --keys-from-tokens at 512 differs from the hash_ids")
                failures += 1
    print(f"{len(traces) + len(token_traces)} traces compared in {runs} runs, {failures} differences")
    return 1 if failures else 0


def main():
    if len(sys.argv) >= 3 and sys.argv[1] == "--check":
        sys.exit(check(sys.argv[2], sys.argv[3:]))
    capacities = [int(c) for c in sys.argv[2:]] or [1_000_000, 3_000_000, 10_000_000, 50_000_000]
    print(json.dumps(reference(sys.argv[1], capacities)))


if __name__ == "__main__":
    main()
