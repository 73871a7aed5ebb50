#!/usr/bin/python3
"""Engine stand-in: a fake vLLM OpenAI server, the independent oracle of crescent's KV-aware router tests.

It speaks what a router needs from a vLLM engine and nothing more, written from vLLM's public behaviour and
shares no code with crescent:
  * the OpenAI API (/v1/completions, /v1/chat/completions, streamed as SSE over chunked HTTP/1.1), /health,
    /v1/models, and vLLM's Prometheus names on /metrics;
  * a prefix cache of full blocks (LRU) whose changes go out as vLLM KV events (msgpack batches on a ZeroMQ PUB
    socket, a ROUTER socket replaying the buffered ones);
  * vLLM's NIXL-connector P/D handshake as its toy proxy drives it (kv_transfer_params), the KV "pull" being an
    HTTP call between two stand-ins;
  * with --kv-pool, a KV connector's shared store (LMCache's or Mooncake's): a prompt's blocks after its
    locally cached ones are loaded from a pool stand-in (`engine_standin.py pool`) that every prefill writes to.
Time is simulated with sleeps: one prefill at a time (FIFO), prefill_base_s + pool-loaded tokens *
kv_pool_load_s_per_token + uncached tokens * prefill_s_per_token, then one token every decode_step_s. Tokens are a formula of the prompt, so tests know the
answer in advance. Test hooks: GET /standin/stats, POST /standin/clear, --drop-batches (gaps on the PUB socket).

  /usr/bin/python3 engine_standin.py --model NAME [--host 127.0.0.1] [--port 0] [--role both|prefill|decode]
      [--block-size 16] [--cache-blocks 1024] [--vocab-size 128256] [--max-model-len 131072]
      [--prefill-s-per-token 0.0001] [--prefill-base-s 0.002] [--decode-step-s 0.005]
      [--kv-events on|off] [--kv-events-port 0] [--kv-replay-port 0] [--replay-buffer 1000]
      [--drop-batches SEQS|every:N] [--kv-pool URL] [--kv-pool-load-s-per-token 0]
      [--engine-id ID] [--ready-file PATH]
  /usr/bin/python3 engine_standin.py pool [--host 127.0.0.1] [--port 0] [--capacity-blocks 1048576]
      [--ready-file PATH]

When ready it prints one JSON line {"http", "kv_events", "kv_replay", "pid"} (also written to --ready-file).
SIGTERM or SIGINT: exit 0. See README.md next to this file.
"""
import argparse
import collections
import dataclasses
import hashlib
import http.client
import http.server
import json
import os
import queue
import select
import signal
import socket
import struct
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid

import msgpack
import zmq

END_OF_REPLAY = (-1).to_bytes(8, "big", signed=True)
HELD_KV_S = 60.0             # how long a prefill keeps KV for its decode side to pull
PREFILL_WAIT_S = 300.0       # longest a request waits in the prefill queue (then 503)
KV_PULL_TIMEOUT_S = 10.0
IDLE_CONNECTION_S = 120.0    # an idle keep-alive connection is closed after this
CLIENT_POLL_S = 0.05         # how often a queued request checks that its client is still there
MEDIUM = "GPU"


class ApiError(Exception):
    """An OpenAI-style error answer: {"error": {"message", "type", "param", "code"}}."""
    TYPES = {400: "BadRequestError", 404: "NotFoundError", 500: "InternalServerError",
             503: "ServiceUnavailableError"}

    def __init__(self, status, message, param=None):
        super().__init__(message)
        self.status = status
        self.param = param

    def body(self):
        return {"error": {"message": str(self), "type": self.TYPES.get(self.status, "Error"),
                          "param": self.param, "code": self.status}}


# ---- requests ------------------------------------------------------------------------------------------------

@dataclasses.dataclass
class Request:
    chat: bool
    tokens: list
    max_tokens: int
    stream: bool
    include_usage: bool
    kv_transfer: dict | None


def typed_field(body, name, kinds, default):
    """body[name] if it has one of the JSON types `kinds` (a bool is no number), default if absent or null."""
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        raise ApiError(400, f"'{name}' has the wrong type", name)
    return value


def prompt_token_ids(prompt, vocab_size):
    """A string is its UTF-8 bytes; else a list of token ids, or a list holding exactly one such list."""
    if isinstance(prompt, str):
        ids = list(prompt.encode())
    elif isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], list):
        ids = prompt[0]
    elif isinstance(prompt, list):
        ids = prompt
    else:
        raise ApiError(400, "'prompt' must be a string or a list of token ids", "prompt")
    if not ids:
        raise ApiError(400, "'prompt' is empty", "prompt")
    if not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab_size for t in ids):
        raise ApiError(400, f"'prompt' token ids must be integers in [0, {vocab_size})", "prompt")
    return ids


def message_text(content):
    """A message's content: a string, null, or a list of {"type": "text", "text"} parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                         and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    raise ApiError(400, "a message's 'content' must be a string or a list of text parts", "messages")


def chat_token_ids(messages):
    """The bytes of the stand-in's template: "<role>content\\n" per message, then "<assistant>"."""
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "'messages' must be a non-empty list", "messages")
    text = ""
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise ApiError(400, "each message needs a string 'role'", "messages")
        text += f"<{message['role']}>{message_text(message.get('content'))}\n"
    return list((text + "<assistant>").encode())


def parse_request(raw, chat, cfg):
    """The body of /v1/completions or /v1/chat/completions, checked as vLLM does (400, or 404 for the model)."""
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise ApiError(400, "the body is not valid JSON") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the body must be a JSON object")
    model = typed_field(body, "model", (str,), None)
    if model is not None and model != cfg.model:
        raise ApiError(404, f"The model `{model}` does not exist.", "model")
    for name, kinds in (("temperature", (int, float)), ("top_p", (int, float)), ("seed", (int,)),
                        ("min_tokens", (int,)), ("stop", (str, list)), ("ignore_eos", (bool,))):
        typed_field(body, name, kinds, None)  # accepted and ignored, but of the right type
    tokens = chat_token_ids(body.get("messages")) if chat else prompt_token_ids(body.get("prompt"), cfg.vocab_size)
    max_tokens = typed_field(body, "max_tokens", (int,), None)
    if chat and max_tokens is None:
        max_tokens = typed_field(body, "max_completion_tokens", (int,), None)
    max_tokens = 16 if max_tokens is None else max_tokens
    if max_tokens < 1:
        raise ApiError(400, "'max_tokens' must be at least 1", "max_tokens")
    if len(tokens) + max_tokens > cfg.max_model_len:
        raise ApiError(400, f"This model's maximum context length is {cfg.max_model_len} tokens. However, you "
                            f"requested {len(tokens) + max_tokens} tokens ({len(tokens)} in the prompt, "
                            f"{max_tokens} for the completion).", "max_tokens")
    stream_options = typed_field(body, "stream_options", (dict,), {})
    return Request(chat=chat, tokens=tokens, max_tokens=max_tokens,
                   stream=typed_field(body, "stream", (bool,), False),
                   include_usage=typed_field(stream_options, "include_usage", (bool,), False),
                   kv_transfer=typed_field(body, "kv_transfer_params", (dict,), None))


def output_token(tokens, k, vocab_size):
    """Token k (0-based) of the answer to prompt `tokens`."""
    return (sum(tokens) * 31 + k * 7919) % vocab_size


# ---- answers -------------------------------------------------------------------------------------------------

def usage(prompt_tokens, completion_tokens, cached_tokens):
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


@dataclasses.dataclass
class Reply:
    """The shapes of one request's answer, in vLLM's text_completion or chat.completion objects."""
    id: str
    model: str
    chat: bool
    created: int = dataclasses.field(default_factory=lambda: int(time.time()))

    def _head(self, obj):
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def body(self, text, used, kv_transfer_params):
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                      "finish_reason": "length", "stop_reason": None}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length", "stop_reason": None}
        return {**self._head("chat.completion" if self.chat else "text_completion"), "choices": [choice],
                "usage": used, "kv_transfer_params": kv_transfer_params}

    def role_chunk(self):
        return {**self._head("chat.completion.chunk"), "choices": [
            {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}]}

    def token_chunk(self, text, finish_reason):
        if self.chat:
            choice = {"index": 0, "delta": {"content": text}, "logprobs": None, "finish_reason": finish_reason}
            return {**self._head("chat.completion.chunk"), "choices": [choice]}
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason, "stop_reason": None}
        return {**self._head("text_completion"), "choices": [choice]}

    def usage_chunk(self, used):
        return {**self._head("chat.completion.chunk" if self.chat else "text_completion"), "choices": [],
                "usage": used}


# ---- prefix cache --------------------------------------------------------------------------------------------

def block_hashes(tokens, block_size):
    """The stand-in's own chained hashes of the prompt's full blocks: the first 8 bytes of
    sha256(parent's 8 bytes + the block's ids as 4-byte big-endian), read as a signed 64-bit integer."""
    hashes, parent = [], b""
    for start in range(0, len(tokens) - block_size + 1, block_size):
        digest = hashlib.sha256(parent + struct.pack(f">{block_size}I", *tokens[start:start + block_size]))
        parent = digest.digest()[:8]
        hashes.append(int.from_bytes(parent, "big", signed=True))
    return hashes


def missing_runs(present):
    """[first, end) index ranges of consecutive False in `present`."""
    runs, first = [], None
    for i, here in enumerate(present + [True]):
        if not here and first is None:
            first = i
        elif here and first is not None:
            runs.append((first, i))
            first = None
    return runs


class PrefixCache:
    """Full blocks by hash, least recently used first. A prompt's blocks are refreshed tail first (as vLLM
    frees them), so eviction takes a prompt's last blocks before its first ones."""

    def __init__(self, block_size, capacity):
        self.block_size = block_size
        self.capacity = capacity
        self.blocks = collections.OrderedDict()

    def hit_tokens(self, hashes, prompt_len):
        """Tokens of the prompt's leading cached blocks; at most prompt_len - 1 (one token is always computed)."""
        hits = 0
        while hits < len(hashes) and hashes[hits] in self.blocks:
            hits += 1
        return min(hits, (prompt_len - 1) // self.block_size) * self.block_size

    def insert(self, hashes, tokens):
        """Stores the prompt's full blocks (at most `capacity` of them); returns the KV events of the change."""
        hashes = hashes[:self.capacity]
        present = [h in self.blocks for h in hashes]
        for h, here in zip(hashes, present):
            if here:
                self.blocks.move_to_end(h)  # out of the eviction's way
        overflow = len(self.blocks) + present.count(False) - self.capacity
        evicted = [self.blocks.popitem(last=False)[0] for _ in range(max(0, overflow))]
        events = [["BlockRemoved", evicted, MEDIUM]] if evicted else []
        bs = self.block_size
        for first, end in missing_runs(present):
            parent = hashes[first - 1] if first > 0 else None
            events.append(["BlockStored", hashes[first:end], parent, tokens[first * bs:end * bs], bs, None, MEDIUM])
        for h in reversed(hashes):
            self.blocks[h] = None
            self.blocks.move_to_end(h)
        return events

    def clear(self):
        self.blocks.clear()


class KvPool:
    """The shared KV pool of engines whose connector stores every prefill's blocks in it and loads a prompt's
    next blocks from it on a local miss (vLLM with LMCache's or Mooncake's store connector): full blocks by the
    stand-ins' hash, least recently used first, `capacity` blocks."""

    def __init__(self, capacity):
        self.capacity = capacity
        self.blocks = collections.OrderedDict()
        self.lock = threading.Lock()
        self.counts = collections.Counter()

    def look_up(self, hashes):
        """How many of `hashes`, from the first on, the pool holds (touched as used)."""
        with self.lock:
            n = 0
            while n < len(hashes) and hashes[n] in self.blocks:
                self.blocks.move_to_end(hashes[n])
                n += 1
            self.counts["lookups"] += 1
            self.counts["blocks_found"] += n
            return n

    def store(self, hashes):
        with self.lock:
            for h in hashes[-self.capacity:]:
                self.blocks[h] = None
                self.blocks.move_to_end(h)
            while len(self.blocks) > self.capacity:
                self.blocks.popitem(last=False)
            self.counts["stores"] += 1

    def stats(self):
        with self.lock:
            return {"blocks": len(self.blocks), **self.counts}


class KvPoolClient:
    """An engine's side of the pool: POST {url}/pool/lookup and /pool/store with {"hashes": [...]}, each
    thread on a keep-alive connection of its own. Stores go out from a thread of their own, as a connector
    saves KV without holding up the next prefill. A pool that does not answer is a miss (and counted), as a
    connector whose store is down loads nothing."""

    def __init__(self, url):
        self.url = urllib.parse.urlsplit(url)  # checked by parse_args
        self.failures = 0
        self.failures_lock = threading.Lock()  # the prefill worker and the store thread both count
        self.local = threading.local()
        self.stores = queue.Queue()
        threading.Thread(target=self._store_loop, daemon=True).start()

    def _call(self, path, hashes):
        body = json.dumps({"hashes": hashes}).encode()
        for attempt in range(2):  # a kept-alive connection the pool closed meanwhile: once more on a new one
            if getattr(self.local, "conn", None) is None:
                self.local.conn = http.client.HTTPConnection(self.url.hostname, self.url.port,
                                                             timeout=KV_PULL_TIMEOUT_S)
            try:
                self.local.conn.request("POST", path, body, {"Content-Type": "application/json"})
                response = self.local.conn.getresponse()
                answer = json.loads(response.read())
                if response.status == 200:
                    return answer
                break
            except (OSError, ValueError, http.client.HTTPException):
                self.local.conn.close()
                self.local.conn = None
        with self.failures_lock:
            self.failures += 1
        return None

    def look_up(self, hashes):
        answer = self._call("/pool/lookup", hashes) if hashes else None
        return answer["blocks"] if isinstance(answer, dict) and isinstance(answer.get("blocks"), int) else 0

    def store(self, hashes):
        if hashes:
            self.stores.put(hashes)

    def _store_loop(self):
        while True:
            self._call("/pool/store", self.stores.get())


# ---- KV events -----------------------------------------------------------------------------------------------

def parse_drops(spec):
    """--drop-batches: "3,7,8" or "every:N" (seqs N-1, 2N-1, ...) -> a predicate on sequence numbers."""
    try:
        if spec.startswith("every:"):
            n = int(spec[len("every:"):])
            if n < 1:
                raise ValueError
            return lambda seq: seq % n == n - 1
        seqs = {int(s) for s in spec.split(",") if s.strip()}
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad --drop-batches '{spec}'") from None
    return seqs.__contains__


def bind(sock, host, port):
    sock.bind(f"tcp://{host}:{port if port else '*'}")
    return sock.getsockopt_string(zmq.LAST_ENDPOINT)


class KvEventPublisher:
    """vLLM's KV-event transport. Batches get their sequence number when handed over (so the stats are exact at
    once); one thread owns both ZeroMQ sockets: it sends the batches on PUB (except the dropped ones), keeps the
    last `replay_size` in a buffer and answers replay requests on ROUTER."""

    def __init__(self, host, events_port, replay_port, replay_size, dropped):
        self.replay = collections.deque(maxlen=replay_size)
        self.is_dropped = dropped
        self.lock = threading.Lock()
        self.next_seq = 0
        self.dropped = 0
        self.pending = collections.deque()
        self.wake_read, self.wake_write = os.pipe()
        os.set_blocking(self.wake_write, False)
        self.stopping = threading.Event()
        self.ready = threading.Event()
        self.endpoints = None
        self.thread = threading.Thread(target=self._run, args=(host, events_port, replay_port), daemon=True)
        self.thread.start()
        if not self.ready.wait(10) or self.endpoints is None:
            raise RuntimeError("the KV event sockets did not come up")

    def publish(self, events):
        """Queues one batch [timestamp, events, data-parallel rank]; thread-safe."""
        with self.lock:
            seq = self.next_seq
            self.next_seq += 1
            drop = self.is_dropped(seq)
            self.dropped += drop
            payload = msgpack.packb([time.time(), events, None], use_bin_type=True)
            self.pending.append((seq.to_bytes(8, "big"), payload, drop))
        try:
            os.write(self.wake_write, b"!")
        except BlockingIOError:
            pass  # the pipe is full of wake-ups already

    def counts(self):
        with self.lock:
            return self.next_seq, self.dropped

    def stop(self):
        self.stopping.set()
        os.write(self.wake_write, b"!")
        self.thread.join(5)

    def _run(self, host, events_port, replay_port):
        ctx = zmq.Context()
        pub, router = ctx.socket(zmq.PUB), ctx.socket(zmq.ROUTER)
        for sock in (pub, router):
            sock.setsockopt(zmq.LINGER, 0)
        router.setsockopt(zmq.SNDHWM, 0)  # a whole replay may be queued at once
        try:
            self.endpoints = (bind(pub, host, events_port), bind(router, host, replay_port))
        except zmq.ZMQError as e:
            print(f"engine_standin: cannot bind the KV event sockets: {e}", file=sys.stderr)
        self.ready.set()
        poller = zmq.Poller()
        poller.register(router, zmq.POLLIN)
        poller.register(self.wake_read, zmq.POLLIN)
        while self.endpoints and not self.stopping.is_set():
            ready = dict(poller.poll(500))
            if self.wake_read in ready:
                os.read(self.wake_read, 4096)
            self._send_pending(pub)
            if router in ready:
                self._answer_replays(router)
        pub.close()
        router.close()
        ctx.term()

    def _send_pending(self, pub):
        while True:
            with self.lock:
                if not self.pending:
                    return
                seq, payload, drop = self.pending.popleft()
            self.replay.append((seq, payload))
            if not drop:
                pub.send_multipart([b"", seq, payload])

    def _answer_replays(self, router):
        """[identity, b"", start seq] -> every buffered batch from start on, then the end marker (seq -1)."""
        while True:
            try:
                frames = router.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if len(frames) != 3 or frames[1] != b"" or len(frames[2]) != 8:
                print(f"engine_standin: ignoring a malformed replay request of {len(frames)} frames", file=sys.stderr)
                continue
            identity, start = frames[0], int.from_bytes(frames[2], "big")
            for seq, payload in self.replay:
                if int.from_bytes(seq, "big") >= start:
                    router.send_multipart([identity, b"", seq, payload])
            router.send_multipart([identity, b"", END_OF_REPLAY, b""])


# ---- the engine ----------------------------------------------------------------------------------------------

@dataclasses.dataclass
class PrefillJob:
    tokens: list
    hashes: list
    cached_tokens: int = 0
    done: threading.Event = dataclasses.field(default_factory=threading.Event)


@dataclasses.dataclass
class HeldKv:
    tokens: list
    block_ids: list
    deadline: float


class Engine:
    """The simulated engine: prefix cache, FIFO prefill worker, decode accounting, KV held for P/D, counters."""

    def __init__(self, cfg, publisher):
        self.cfg = cfg
        self.publisher = publisher
        self.http_port = None
        self.lock = threading.Lock()
        self.queue_changed = threading.Condition(self.lock)
        self.cache = PrefixCache(cfg.block_size, cfg.cache_blocks)
        self.queue = collections.deque()
        self.prefilling = False
        self.decoding = 0
        self.held = {}
        self.next_block_id = 0
        self.next_held = 0
        self.counts = collections.Counter()
        self.request_ids = collections.Counter()
        self.stopping = False
        self.pool = KvPoolClient(cfg.kv_pool) if cfg.kv_pool else None
        self.worker = threading.Thread(target=self._prefill_loop, daemon=True)
        self.worker.start()

    def stop(self):
        with self.lock:
            self.stopping = True
            self.queue_changed.notify_all()
        self.worker.join(5)

    # prefill

    def prefill(self, tokens, client_gone):
        """Runs the prompt's prefill in the FIFO queue; its cached tokens, or None if the client went away while
        it waited. 503 if it waited longer than PREFILL_WAIT_S."""
        job = PrefillJob(tokens, block_hashes(tokens, self.cfg.block_size))
        with self.lock:
            self.queue.append(job)
            self.queue_changed.notify()
        deadline = time.monotonic() + PREFILL_WAIT_S
        while not job.done.wait(CLIENT_POLL_S):
            gone, late = client_gone(), time.monotonic() > deadline
            if (gone or late) and self._withdraw(job):
                if late:
                    raise ApiError(503, "timed out waiting for a prefill slot")
                return None
        return job.cached_tokens

    def _withdraw(self, job):
        """Takes a job out of the queue; False if its prefill already started."""
        with self.lock:
            if job not in self.queue:
                return False
            self.queue.remove(job)
            self.counts["aborted"] += 1
            return True

    def _prefill_loop(self):
        while True:
            with self.lock:
                while not self.queue and not self.stopping:
                    self.queue_changed.wait(0.5)
                if self.stopping:
                    return
                job = self.queue.popleft()
                self.prefilling = True
                job.cached_tokens = self._look_up(job.tokens, job.hashes)
            pooled = self._load_from_pool(job) if self.pool else 0
            time.sleep(self.cfg.prefill_base_s + pooled * self.cfg.kv_pool_load_s_per_token +
                       (len(job.tokens) - job.cached_tokens - pooled) * self.cfg.prefill_s_per_token)
            job.cached_tokens += pooled
            with self.lock:
                self._store(job.tokens, job.hashes)
                self.counts["prefills"] += 1
                self.prefilling = False
            if self.pool:
                self.pool.store(job.hashes)  # the connector saves the prompt's blocks once they are computed
            job.done.set()

    def _load_from_pool(self, job):
        """The prompt's tokens after its locally cached ones that the shared pool holds (whole blocks, at most
        len - 1 tokens in all), counted as vLLM counts a connector's hits."""
        bs = self.cfg.block_size
        local_blocks = job.cached_tokens // bs
        wanted = job.hashes[local_blocks:(len(job.tokens) - 1) // bs]
        pooled = self.pool.look_up(wanted) * bs
        with self.lock:
            self.counts["external_prefix_queries"] += len(job.tokens) - job.cached_tokens
            self.counts["external_prefix_hits"] += pooled
        return pooled

    def _look_up(self, tokens, hashes):
        """(lock held) The prompt's cached tokens, counted in the prefix-cache and prompt counters."""
        hit = self.cache.hit_tokens(hashes, len(tokens))
        self.counts["prefix_queries"] += len(tokens)
        self.counts["prefix_hits"] += hit
        self.counts["prompt_tokens"] += len(tokens)
        return hit

    def _store(self, tokens, hashes):
        """(lock held) Caches the prompt's full blocks and publishes the change as one batch."""
        events = self.cache.insert(hashes, tokens)
        if events and self.publisher:
            self.publisher.publish(events)

    def clear_cache(self):
        with self.lock:
            self.cache.clear()
            if self.publisher:
                self.publisher.publish([["AllBlocksCleared"]])

    # P/D

    def hold(self, tokens, request_id):
        """Keeps a finished prefill's KV for the decode side; returns the kv_transfer_params to hand it."""
        n_blocks = -(-len(tokens) // self.cfg.block_size)
        with self.lock:
            self._expire_held()
            block_ids = list(range(self.next_block_id, self.next_block_id + n_blocks))
            self.next_block_id += n_blocks
            remote_request_id = f"{request_id}-{self.next_held}"
            self.next_held += 1
            self.held[remote_request_id] = HeldKv(tokens, block_ids, time.monotonic() + HELD_KV_S)
        return {"do_remote_prefill": True, "do_remote_decode": False, "remote_engine_id": self.cfg.engine_id,
                "remote_block_ids": block_ids, "remote_host": self.cfg.host, "remote_port": self.http_port,
                "remote_request_id": remote_request_id, "tp_size": 1}

    def pull(self, request):
        """POST /standin/kv_pull: hands a held KV over (once). 404 unknown or expired, 400 other block ids."""
        with self.lock:
            self._expire_held()
            held = self.held.get(request.get("remote_request_id"))
            if held is None or request.get("remote_engine_id") != self.cfg.engine_id:
                raise ApiError(404, f"no KV held for request {request.get('remote_request_id')!r} "
                                    f"of engine {request.get('remote_engine_id')!r}")
            block_ids = request.get("remote_block_ids")
            if block_ids is not None and block_ids != held.block_ids:
                raise ApiError(400, "remote_block_ids differ from the blocks held", "remote_block_ids")
            del self.held[request["remote_request_id"]]
            return {"prompt_token_ids": held.tokens, "block_ids": held.block_ids}

    def _expire_held(self):
        now = time.monotonic()
        for request_id in [r for r, held in self.held.items() if held.deadline < now]:
            del self.held[request_id]

    def accept_remote_kv(self, tokens):
        """A decode request's prompt KV arrived from its prefill: cache it (no prefill); its locally cached tokens."""
        hashes = block_hashes(tokens, self.cfg.block_size)
        with self.lock:
            cached = self._look_up(tokens, hashes)
            self._store(tokens, hashes)
            self.counts["remote_prefill_decodes"] += 1
        return cached

    # decode and bookkeeping

    def record_request_id(self, request_id):
        if request_id is not None:
            with self.lock:
                self.request_ids[request_id] += 1

    def decode_started(self):
        with self.lock:
            self.decoding += 1

    def token_generated(self):
        with self.lock:
            self.counts["generation_tokens"] += 1

    def decode_ended(self, finished):
        with self.lock:
            self.decoding -= 1
            self.counts["completions" if finished else "aborted"] += 1

    def stats(self):
        published, dropped = self.publisher.counts() if self.publisher else (0, 0)
        with self.lock:
            return {"request_ids": dict(self.request_ids), "completions": self.counts["completions"],
                    "prefills": self.counts["prefills"],
                    "remote_prefill_decodes": self.counts["remote_prefill_decodes"],
                    "prefix_queries_tokens": self.counts["prefix_queries"],
                    "prefix_hits_tokens": self.counts["prefix_hits"],
                    "pool_queries_tokens": self.counts["external_prefix_queries"],
                    "pool_hits_tokens": self.counts["external_prefix_hits"],
                    "pool_failures": self.pool.failures if self.pool else 0,
                    "batches_published": published, "batches_dropped": dropped,
                    "cached_blocks": len(self.cache.blocks),
                    "aborted": self.counts["aborted"], "held_kv": len(self.held),
                    "running": self.decoding + self.prefilling, "waiting": len(self.queue),
                    "engine_id": self.cfg.engine_id, "role": self.cfg.role}

    def metrics(self):
        """Prometheus text exposition with vLLM's metric names."""
        model = f'model_name="{self.cfg.model}"'
        with self.lock:
            c = self.counts
            families = [
                ("vllm:num_requests_running", "gauge", "Requests in prefill or decode.",
                 [(model, self.decoding + self.prefilling)]),
                ("vllm:num_requests_waiting", "gauge", "Requests waiting for their prefill.",
                 [(model, len(self.queue))]),
                ("vllm:kv_cache_usage_perc", "gauge", "Cached blocks over the cache's blocks (0-1).",
                 [(model, len(self.cache.blocks) / self.cfg.cache_blocks)]),
                ("vllm:prefix_cache_queries_total", "counter", "Prompt tokens looked up in the prefix cache.",
                 [(model, c["prefix_queries"])]),
                ("vllm:prefix_cache_hits_total", "counter", "Prompt tokens found in the prefix cache.",
                 [(model, c["prefix_hits"])]),
                ("vllm:external_prefix_cache_queries_total", "counter",
                 "Prompt tokens looked up in the KV connector's store after the prefix cache.",
                 [(model, c["external_prefix_queries"])]),
                ("vllm:external_prefix_cache_hits_total", "counter",
                 "Prompt tokens loaded from the KV connector's store.", [(model, c["external_prefix_hits"])]),
                ("vllm:prompt_tokens_total", "counter", "Prompt tokens processed.", [(model, c["prompt_tokens"])]),
                ("vllm:generation_tokens_total", "counter", "Tokens generated.", [(model, c["generation_tokens"])]),
                ("vllm:request_success_total", "counter", "Finished requests by finish reason.",
                 [(f'finished_reason="stop",{model}', 0),  # the stand-in never stops before max_tokens
                  (f'finished_reason="length",{model}', c["completions"]),
                  (f'finished_reason="abort",{model}', c["aborted"])]),
                ("vllm:cache_config_info", "gauge", "Information of the KV cache configuration.",
                 [(f'block_size="{self.cfg.block_size}",cache_dtype="auto",enable_prefix_caching="True",'
                   f'num_cpu_blocks="None",num_gpu_blocks="{self.cfg.cache_blocks}",'
                   f'prefix_caching_hash_algo="standin_sha256"', 1)]),
            ]
        lines = []
        for name, kind, help_text, samples in families:
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
            lines += [f"{name}{{{labels}}} {float(value)}" for labels, value in samples]
        return "\n".join(lines) + "\n"


# ---- HTTP ----------------------------------------------------------------------------------------------------

def pull_remote_kv(kv_transfer, tokens):
    """The decode side of the handshake: fetch the prompt's KV from the prefill stand-in the params name."""
    host, port = kv_transfer.get("remote_host"), kv_transfer.get("remote_port")
    request_id = kv_transfer.get("remote_request_id")
    if not isinstance(host, str) or not isinstance(port, int) or not isinstance(request_id, str):
        raise ApiError(400, "kv_transfer_params with do_remote_prefill need remote_host, remote_port and "
                            "remote_request_id", "kv_transfer_params")
    body = json.dumps({"remote_request_id": request_id, "remote_engine_id": kv_transfer.get("remote_engine_id"),
                       "remote_block_ids": kv_transfer.get("remote_block_ids")}).encode()
    request = urllib.request.Request(f"http://{host}:{port}/standin/kv_pull", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through an http_proxy
    try:
        with opener.open(request, timeout=KV_PULL_TIMEOUT_S) as answer:
            held = json.load(answer)
    except urllib.error.HTTPError as e:
        raise ApiError(400 if e.code in (400, 404) else 500,
                       f"KV pull from {host}:{port} failed ({e.code}): {e.read().decode(errors='replace')}",
                       "kv_transfer_params") from None
    except (OSError, ValueError) as e:
        raise ApiError(500, f"KV pull from {host}:{port} failed: {e}", "kv_transfer_params") from None
    if not isinstance(held, dict) or held.get("prompt_token_ids") != tokens:
        raise ApiError(400, "the remote prefill ran another prompt than this request's", "kv_transfer_params")


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"   # keep-alive, chunked streams
    server_version = "engine-standin"
    timeout = IDLE_CONNECTION_S
    disable_nagle_algorithm = True  # one SSE chunk per token must not wait for the previous one's ACK

    def log_message(self, format, *args):
        pass

    @property
    def engine(self):
        return self.server.engine

    def do_GET(self):
        self._dispatch({"/health": Handler._health, "/v1/models": Handler._models, "/metrics": Handler._metrics,
                        "/standin/stats": Handler._stats})

    def do_POST(self):
        self._dispatch({"/v1/completions": Handler._completions, "/v1/chat/completions": Handler._chat,
                        "/standin/clear": Handler._clear, "/standin/kv_pull": Handler._kv_pull})

    def _dispatch(self, routes):
        path = self.path.split("?", 1)[0]
        try:
            body = self._read_body()
            route = routes.get(path)
            if route is None:
                raise ApiError(404, f"no route {self.command} {path}")
            route(self, body)
        except ApiError as e:
            self._send_json(e.status, e.body())
        except (ConnectionError, TimeoutError):
            self.close_connection = True

    def _read_body(self):
        try:
            if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
                return self._read_chunked_body()
            length = int(self.headers.get("Content-Length", 0))
        except ValueError:
            self.close_connection = True
            raise ApiError(400, "bad Content-Length or chunk size") from None
        return self.rfile.read(length) if length > 0 else b""

    def _read_chunked_body(self):
        chunks = []
        while size := int(self.rfile.readline().split(b";")[0], 16):
            chunks.append(self.rfile.read(size))
            self.rfile.readline()
        while self.rfile.readline() not in (b"\r\n", b"\n", b""):
            pass  # trailers
        return b"".join(chunks)

    def _send(self, status, content_type, data, headers=()):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for name, value in headers:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def _send_json(self, status, obj, headers=()):
        self._send(status, "application/json", json.dumps(obj).encode(), headers)

    def _client_gone(self):
        """True once the client closed its connection (EOF pending on the socket)."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):
            return True

    # small routes

    def _health(self, _body):
        self._send(200, "text/plain", b"")

    def _models(self, _body):
        model = {"id": self.engine.cfg.model, "object": "model", "created": int(time.time()), "owned_by": "vllm",
                 "root": self.engine.cfg.model, "parent": None, "max_model_len": self.engine.cfg.max_model_len}
        self._send_json(200, {"object": "list", "data": [model]})

    def _metrics(self, _body):
        self._send(200, "text/plain; version=0.0.4; charset=utf-8", self.engine.metrics().encode())

    def _stats(self, _body):
        self._send_json(200, self.engine.stats())

    def _clear(self, _body):
        self.engine.clear_cache()
        self._send_json(200, {"cleared": True})

    def _kv_pull(self, body):
        try:
            request = json.loads(body)
        except ValueError:
            raise ApiError(400, "the body is not valid JSON") from None
        if not isinstance(request, dict):
            raise ApiError(400, "the body must be a JSON object")
        self._send_json(200, self.engine.pull(request))

    # completions

    def _completions(self, body):
        self._serve(body, chat=False)

    def _chat(self, body):
        self._serve(body, chat=True)

    def _serve(self, body, chat):
        header_id = self.headers.get("X-Request-Id")
        self.engine.record_request_id(header_id)
        request = parse_request(body, chat, self.engine.cfg)
        reply = Reply(("chatcmpl-" if chat else "cmpl-") + (header_id or uuid.uuid4().hex), self.engine.cfg.model, chat)
        kv_transfer = request.kv_transfer or {}
        if kv_transfer.get("do_remote_prefill"):
            pull_remote_kv(kv_transfer, request.tokens)
            self._answer(request, reply, self.engine.accept_remote_kv(request.tokens))
        elif kv_transfer.get("do_remote_decode"):
            self._prefill_for_remote_decode(request, reply)
        else:
            cached = self.engine.prefill(request.tokens, self._client_gone)
            if cached is None:
                self.close_connection = True
            else:
                self._answer(request, reply, cached)

    def _prefill_for_remote_decode(self, request, reply):
        """The prefill side of P/D: prefill, one token, non-streamed, and the KV held for the decode side."""
        cached = self.engine.prefill(request.tokens, self._client_gone)
        texts = []
        if cached is None or not self._decode(request.tokens, 1, texts):
            self.close_connection = True
            return
        kv_transfer_params = self.engine.hold(request.tokens, reply.id)
        self._send_json(200, reply.body(texts[0], usage(len(request.tokens), 1, cached), kv_transfer_params),
                        self._id_header())

    def _answer(self, request, reply, cached):
        used = lambda n: usage(len(request.tokens), n, cached)  # noqa: E731
        if not request.stream:
            texts = []
            if self._decode(request.tokens, request.max_tokens, texts):
                self._send_json(200, reply.body("".join(texts), used(len(texts)), None), self._id_header())
            else:
                self.close_connection = True
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        for name, value in self._id_header():
            self.send_header(name, value)
        self.end_headers()
        if not self._decode(request.tokens, request.max_tokens, _EventSink(self, reply, request.max_tokens)):
            self.close_connection = True
            return
        if request.include_usage:
            self._send_event(reply.usage_chunk(used(request.max_tokens)))
        self._send_event("[DONE]")
        self.wfile.write(b"0\r\n\r\n")

    def _id_header(self):
        header_id = self.headers.get("X-Request-Id")
        return [("X-Request-Id", header_id)] if header_id is not None else []

    def _send_event(self, obj):
        data = b"data: " + (obj.encode() if isinstance(obj, str) else json.dumps(obj).encode()) + b"\n\n"
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

    def _decode(self, tokens, n, sink):
        """Emits n tokens into sink (a list of texts or an _EventSink): the first at once, then one every
        decode_step_s. False if the client went away first."""
        step = self.engine.cfg.decode_step_s
        vocab = self.engine.cfg.vocab_size
        self.engine.decode_started()
        finished = False
        try:
            start = time.monotonic()
            for k in range(n):
                pause = start + k * step - time.monotonic()
                if pause > 0:
                    time.sleep(pause)
                if self._client_gone():
                    return False
                sink.append(f" t{output_token(tokens, k, vocab)}")
                self.engine.token_generated()
            finished = True
        except (ConnectionError, TimeoutError):
            return False
        finally:
            self.engine.decode_ended(finished)
        return True


class _EventSink:
    """Turns each token text into its SSE chunk (a chat stream starts with the role chunk)."""

    def __init__(self, handler, reply, n_tokens):
        self.handler, self.reply, self.n_tokens, self.sent = handler, reply, n_tokens, 0

    def append(self, text):
        if self.reply.chat and self.sent == 0:
            self.handler._send_event(self.reply.role_chunk())
        self.sent += 1
        self.handler._send_event(self.reply.token_chunk(text, "length" if self.sent == self.n_tokens else None))


class PoolHandler(Handler):
    """The KV pool stand-in's HTTP: POST /pool/lookup and /pool/store {"hashes": [...]}, GET /pool/stats."""
    server_version = "kv-pool-standin"

    def do_GET(self):
        self._dispatch({"/health": Handler._health, "/pool/stats": PoolHandler._pool_stats})

    def do_POST(self):
        self._dispatch({"/pool/lookup": PoolHandler._lookup, "/pool/store": PoolHandler._store})

    def _hashes(self, body):
        try:
            hashes = json.loads(body)["hashes"]
        except (ValueError, KeyError, TypeError, UnicodeDecodeError):
            raise ApiError(400, "the body must be {\"hashes\": [...]}") from None
        if not isinstance(hashes, list) or not all(isinstance(h, int) for h in hashes):
            raise ApiError(400, "'hashes' must be a list of integers", "hashes")
        return hashes

    def _lookup(self, body):
        self._send_json(200, {"blocks": self.server.pool.look_up(self._hashes(body))})

    def _store(self, body):
        self.server.pool.store(self._hashes(body))
        self._send_json(200, {})

    def _pool_stats(self, _body):
        self._send_json(200, self.server.pool.stats())


class StandinServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # a router opening many connections at once must not hit the listen backlog


# ---- main ----------------------------------------------------------------------------------------------------

def parse_args(argv):
    p = argparse.ArgumentParser(description="A fake vLLM engine for router tests (see the file's docstring).")
    p.add_argument("--model", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--role", choices=("both", "prefill", "decode"), default="both")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--cache-blocks", type=int, default=1024)
    p.add_argument("--vocab-size", type=int, default=128256)
    p.add_argument("--max-model-len", type=int, default=131072)
    p.add_argument("--prefill-s-per-token", type=float, default=0.0001)
    p.add_argument("--prefill-base-s", type=float, default=0.002)
    p.add_argument("--decode-step-s", type=float, default=0.005)
    p.add_argument("--kv-events", choices=("on", "off"), default="on")
    p.add_argument("--kv-events-port", type=int, default=0)
    p.add_argument("--kv-replay-port", type=int, default=0)
    p.add_argument("--replay-buffer", type=int, default=1000)
    p.add_argument("--drop-batches", type=parse_drops, default=parse_drops(""))
    p.add_argument("--kv-pool", help="URL of a KV pool stand-in (engine_standin.py pool) shared with others")
    p.add_argument("--kv-pool-load-s-per-token", type=float, default=0.0)
    p.add_argument("--engine-id", default=f"standin-{os.getpid()}")
    p.add_argument("--ready-file")
    cfg = p.parse_args(argv)
    if cfg.block_size < 1 or cfg.cache_blocks < 1 or cfg.replay_buffer < 1 or cfg.max_model_len < 2:
        p.error("--block-size, --cache-blocks and --replay-buffer must be positive, --max-model-len at least 2")
    if not 256 <= cfg.vocab_size <= 2**32:
        p.error("--vocab-size must be in [256, 2^32] (string prompts are bytes)")
    if cfg.kv_pool is not None:
        try:
            url = urllib.parse.urlsplit(cfg.kv_pool)
            if url.scheme != "http" or not url.hostname or url.port is None:
                raise ValueError
        except ValueError:
            p.error(f"--kv-pool must be http://HOST:PORT, not {cfg.kv_pool!r}")
    if cfg.kv_pool_load_s_per_token < 0:
        p.error("--kv-pool-load-s-per-token must be >= 0")
    return cfg


def announce(ready, ready_file):
    line = json.dumps(ready)
    if ready_file:
        tmp = f"{ready_file}.tmp.{os.getpid()}"
        with open(tmp, "w") as f:
            f.write(line + "\n")
        os.replace(tmp, ready_file)
    print(line, flush=True)


def serve_pool(argv):
    """`engine_standin.py pool [--host H] [--port P] [--capacity-blocks N] [--ready-file F]`: the shared KV pool
    stand-ins name with --kv-pool. Announces {"http", "pid"}."""
    p = argparse.ArgumentParser(prog="engine_standin.py pool", description="A KV pool shared by stand-ins.")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--capacity-blocks", type=int, default=1 << 20)
    p.add_argument("--ready-file")
    cfg = p.parse_args(argv)
    if cfg.capacity_blocks < 1:
        p.error("--capacity-blocks must be positive")
    server = StandinServer((cfg.host, cfg.port), PoolHandler)
    server.pool = KvPool(cfg.capacity_blocks)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: threading.Thread(target=server.shutdown, daemon=True).start())
    announce({"http": f"http://{cfg.host}:{server.server_address[1]}", "pid": os.getpid()}, cfg.ready_file)
    server.serve_forever(poll_interval=0.2)
    server.server_close()
    return 0


def main(argv):
    if argv and argv[0] == "pool":
        return serve_pool(argv[1:])
    cfg = parse_args(argv)
    publisher = None
    if cfg.kv_events == "on":
        publisher = KvEventPublisher(cfg.host, cfg.kv_events_port, cfg.kv_replay_port, cfg.replay_buffer,
                                     cfg.drop_batches)
    engine = Engine(cfg, publisher)
    server = StandinServer((cfg.host, cfg.port), Handler)
    server.engine = engine
    engine.http_port = server.server_address[1]
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: threading.Thread(target=server.shutdown, daemon=True).start())
    announce({"http": f"http://{cfg.host}:{engine.http_port}",
              "kv_events": publisher.endpoints[0] if publisher else None,
              "kv_replay": publisher.endpoints[1] if publisher else None,
              "pid": os.getpid()}, cfg.ready_file)
    server.serve_forever(poll_interval=0.2)
    engine.stop()
    if publisher:
        publisher.stop()
    server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
