#!/usr/bin/python3
"""Tests of the engine stand-in (engine_standin.py), each against real stand-in processes: the OpenAI API
streamed and not, the metrics, the prefix cache, the KV events on PUB and their replay on ROUTER, eviction, the
prefill queue's timing, client disconnects, the P/D handshake between two stand-ins, and a KV pool they share.

  /usr/bin/python3 engine_standin_test.py [-v]
"""
import http.client
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.parse

import msgpack
import zmq

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
import engine_standin  # noqa: E402  (its pure functions: block hashes, --drop-batches)

VOCAB = 128256
END_OF_REPLAY = b"\xff" * 8


def expected_text(tokens, n):
    return "".join(f" t{(sum(tokens) * 31 + k * 7919) % VOCAB}" for k in range(n))


class Standin:
    """One stand-in process; stopped with SIGTERM, which must exit 0."""

    def __init__(self, *args):
        self.proc = subprocess.Popen([sys.executable, os.path.join(HERE, "engine_standin.py"), *args],
                                     stdout=subprocess.PIPE, text=True)
        readable, _, _ = select.select([self.proc.stdout], [], [], 15)
        if not readable:
            self.proc.kill()
            raise RuntimeError("the stand-in did not announce itself")
        self.ready = json.loads(self.proc.stdout.readline())
        url = urllib.parse.urlsplit(self.ready["http"])
        self.host, self.port = url.hostname, url.port

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(10)
        finally:
            self.proc.stdout.close()
            if self.proc.poll() is None:
                self.proc.kill()

    def connection(self):
        return http.client.HTTPConnection(self.host, self.port, timeout=15)

    def request(self, method, path, body=None, headers=None, conn=None):
        """(status, headers, body bytes); body is JSON-encoded unless it is bytes."""
        own = conn is None
        conn = conn or self.connection()
        data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
        conn.request(method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
        answer = conn.getresponse()
        result = answer.status, answer.headers, answer.read()
        if own:
            conn.close()
        return result

    def post_json(self, path, body, headers=None, conn=None):
        status, _, data = self.request("POST", path, body, headers, conn)
        return status, json.loads(data)

    def stats(self):
        return json.loads(self.request("GET", "/standin/stats")[2])

    def metrics(self):
        """{(name, labels): value} from /metrics, and the text."""
        text = self.request("GET", "/metrics")[2].decode()
        samples = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                key, value = line.rsplit(" ", 1)
                samples[key] = float(value)
        return samples, text


def sse_events(data):
    """The payloads of an SSE body's `data:` events, JSON-decoded except [DONE]."""
    events = []
    for block in data.decode().split("\n\n"):
        if block.strip():
            assert block.startswith("data: "), block
            payload = block[len("data: "):]
            events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def subscriber(endpoint):
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(endpoint)
    time.sleep(0.3)  # PUB drops what it sends before the subscription arrives
    return sub


def receive(sock, timeout_s=5.0):
    if not sock.poll(int(timeout_s * 1000)):
        raise AssertionError("no message in time")
    return sock.recv_multipart()


def batch(frames):
    """(seq, events) of a PUB message [topic, seq, payload]."""
    topic, seq, payload = frames
    assert topic == b""
    timestamp, events, rank = msgpack.unpackb(payload, raw=False)
    assert isinstance(timestamp, float) and rank is None
    return int.from_bytes(seq, "big"), events


class ApiTest(unittest.TestCase):
    """The OpenAI API and the metrics, on one stand-in."""

    @classmethod
    def setUpClass(cls):
        cls.ready_file = os.path.join(tempfile.mkdtemp(), "ready.json")
        cls.s = Standin("--model", "m1", "--block-size", "4", "--decode-step-s", "0.002",
                        "--ready-file", cls.ready_file)

    @classmethod
    def tearDownClass(cls):
        assert cls.s.stop() == 0

    def test_ready_line_and_file(self):
        with open(self.ready_file) as f:
            self.assertEqual(json.loads(f.read()), self.s.ready)
        self.assertEqual(set(self.s.ready), {"http", "kv_events", "kv_replay", "pid"})
        self.assertEqual(self.s.ready["pid"], self.s.proc.pid)
        self.assertTrue(self.s.ready["kv_events"].startswith("tcp://127.0.0.1:"))
        self.assertTrue(self.s.ready["kv_replay"].startswith("tcp://127.0.0.1:"))

    def test_health_and_models(self):
        self.assertEqual(self.s.request("GET", "/health")[0], 200)
        status, _, data = self.s.request("GET", "/v1/models")
        models = json.loads(data)
        self.assertEqual(status, 200)
        self.assertEqual(models["object"], "list")
        self.assertEqual([(m["id"], m["object"]) for m in models["data"]], [("m1", "model")])
        self.assertGreater(models["data"][0]["max_model_len"], 0)

    def test_completion(self):
        status, body = self.s.post_json("/v1/completions",
                                        {"model": "m1", "prompt": "Hello, stand-in", "max_tokens": 5},
                                        {"X-Request-Id": "req-completion"})
        self.assertEqual(status, 200)
        prompt = list(b"Hello, stand-in")
        self.assertEqual(body["object"], "text_completion")
        self.assertEqual(body["id"], "cmpl-req-completion")
        self.assertEqual(body["choices"][0]["text"], expected_text(prompt, 5))
        self.assertEqual(body["choices"][0]["finish_reason"], "length")
        self.assertEqual(body["usage"], {"prompt_tokens": len(prompt), "completion_tokens": 5,
                                         "total_tokens": len(prompt) + 5,
                                         "prompt_tokens_details": {"cached_tokens": 0}})
        self.assertEqual(self.s.stats()["request_ids"].get("req-completion"), 1)

    def test_prompt_forms(self):
        ids = [5, 77, 1000, 128255, 9]
        answers = [self.s.post_json("/v1/completions", {"prompt": p, "max_tokens": 3, "ignore_eos": True,
                                                        "temperature": 0, "seed": 1, "stop": ["x"], "min_tokens": 1})
                   for p in (ids, [ids])]
        for status, body in answers:
            self.assertEqual(status, 200)
            self.assertEqual(body["choices"][0]["text"], expected_text(ids, 3))
        status, body = self.s.post_json("/v1/completions", {"prompt": [1, 2]})  # max_tokens defaults to 16
        self.assertEqual(body["usage"]["completion_tokens"], 16)

    def test_completion_stream_keeps_the_connection(self):
        conn = self.s.connection()
        prompt = [11, 12, 13, 14, 15, 16, 17]
        for include_usage in (True, False):
            status, headers, data = self.s.request(
                "POST", "/v1/completions", {"prompt": prompt, "max_tokens": 4, "stream": True,
                                            "stream_options": {"include_usage": include_usage}},
                {"X-Request-Id": "req-stream"}, conn)
            self.assertEqual(status, 200)
            self.assertEqual(headers["Content-Type"], "text/event-stream")
            self.assertEqual(headers["Transfer-Encoding"], "chunked")
            events = sse_events(data)
            self.assertEqual(events[-1], "[DONE]")
            tokens = events[:4]
            self.assertEqual([e["object"] for e in tokens], ["text_completion"] * 4)
            self.assertEqual("".join(e["choices"][0]["text"] for e in tokens), expected_text(prompt, 4))
            self.assertEqual([e["choices"][0]["finish_reason"] for e in tokens], [None, None, None, "length"])
            if include_usage:
                self.assertEqual(events[4]["choices"], [])
                self.assertEqual(events[4]["usage"]["completion_tokens"], 4)
                self.assertEqual(events[4]["usage"]["prompt_tokens"], len(prompt))
            self.assertEqual(len(events), 6 if include_usage else 5)
        conn.close()
        self.assertEqual(self.s.stats()["request_ids"].get("req-stream"), 2)

    def test_chat(self):
        messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
        prompt = list(b"<system>Be brief.\n<user>Hi\n<assistant>")
        status, body = self.s.post_json("/v1/chat/completions", {"model": "m1", "messages": messages, "max_tokens": 3},
                                        {"X-Request-Id": "req-chat"})
        self.assertEqual(status, 200)
        self.assertEqual(body["object"], "chat.completion")
        self.assertEqual(body["choices"][0]["message"], {"role": "assistant", "content": expected_text(prompt, 3)})
        self.assertEqual(body["choices"][0]["finish_reason"], "length")
        self.assertEqual(body["usage"]["prompt_tokens"], len(prompt))

        status, headers, data = self.s.request("POST", "/v1/chat/completions", {
            "messages": messages, "max_tokens": 3, "stream": True, "stream_options": {"include_usage": True}},
            {"X-Request-Id": "req-chat"})
        events = sse_events(data)
        self.assertEqual(events[-1], "[DONE]")
        self.assertTrue(all(e["object"] == "chat.completion.chunk" for e in events[:-1]))
        self.assertEqual(events[0]["choices"][0]["delta"]["role"], "assistant")
        content = "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-2])
        self.assertEqual(content, expected_text(prompt, 3))
        self.assertEqual(events[-3]["choices"][0]["finish_reason"], "length")
        self.assertEqual(events[-2]["usage"]["completion_tokens"], 3)
        self.assertEqual(self.s.stats()["request_ids"].get("req-chat"), 2)

    def test_prefix_hit(self):
        before, _ = self.s.metrics()
        prompt = list(range(300, 318))  # 18 tokens: 4 full blocks of 4
        first = self.s.post_json("/v1/completions", {"prompt": prompt, "max_tokens": 1})[1]
        second = self.s.post_json("/v1/completions", {"prompt": prompt, "max_tokens": 1})[1]
        self.assertEqual(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0)
        self.assertEqual(second["usage"]["prompt_tokens_details"]["cached_tokens"], 16)
        exact = list(range(400, 408))  # 2 full blocks: at most 7 tokens hit, so 1 block
        self.s.post_json("/v1/completions", {"prompt": exact, "max_tokens": 1})
        third = self.s.post_json("/v1/completions", {"prompt": exact, "max_tokens": 1})[1]
        self.assertEqual(third["usage"]["prompt_tokens_details"]["cached_tokens"], 4)
        after, _ = self.s.metrics()
        label = '{model_name="m1"}'
        self.assertEqual(after["vllm:prefix_cache_queries_total" + label]
                         - before["vllm:prefix_cache_queries_total" + label], 2 * 18 + 2 * 8)
        self.assertEqual(after["vllm:prefix_cache_hits_total" + label]
                         - before["vllm:prefix_cache_hits_total" + label], 16 + 4)

    def test_metrics(self):
        self.s.post_json("/v1/completions", {"prompt": [1, 2, 3], "max_tokens": 2})
        samples, text = self.s.metrics()
        label = '{model_name="m1"}'
        for name, kind in (("vllm:num_requests_running", "gauge"), ("vllm:num_requests_waiting", "gauge"),
                           ("vllm:kv_cache_usage_perc", "gauge"), ("vllm:prefix_cache_queries_total", "counter"),
                           ("vllm:prefix_cache_hits_total", "counter"), ("vllm:prompt_tokens_total", "counter"),
                           ("vllm:generation_tokens_total", "counter")):
            self.assertIn(f"# TYPE {name} {kind}\n", text)
            self.assertIn(name + label, samples)
        self.assertIn("# TYPE vllm:request_success_total counter\n", text)
        self.assertGreater(samples['vllm:request_success_total{finished_reason="length",model_name="m1"}'], 0)
        self.assertGreater(samples["vllm:generation_tokens_total" + label], 0)
        info = [k for k in samples if k.startswith("vllm:cache_config_info{")]
        self.assertEqual(len(info), 1)
        self.assertIn('block_size="4"', info[0])
        self.assertIn('num_gpu_blocks="1024"', info[0])
        stats = self.s.stats()
        self.assertAlmostEqual(samples["vllm:kv_cache_usage_perc" + label], stats["cached_blocks"] / 1024)

    def test_errors(self):
        def error(path, body):
            status, _, data = self.s.request("POST", path, body)
            err = json.loads(data)["error"]
            self.assertEqual(set(err), {"message", "type", "param", "code"})
            self.assertEqual(err["code"], status)
            return status

        self.assertEqual(error("/v1/completions", {"model": "other", "prompt": "x"}), 404)
        self.assertEqual(error("/v1/chat/completions",
                               {"model": "other", "messages": [{"role": "user", "content": "x"}]}), 404)
        for bad in (b"{not json", b"[1, 2]", {"prompt": [1, VOCAB]}, {"prompt": [1, -1]}, {"prompt": [1, 2.5]},
                    {"prompt": [[1], [2]]}, {"prompt": []}, {"prompt": 7}, {"prompt": "x", "max_tokens": "3"},
                    {"prompt": "x", "max_tokens": 0}, {"prompt": "x", "stream": "yes"}, {"prompt": "x", "model": 3},
                    {"prompt": [1] * 131072}):
            self.assertEqual(error("/v1/completions", bad), 400, bad)
        for bad in ({"messages": "hi"}, {"messages": []}, {"messages": [{"content": "x"}]},
                    {"messages": [{"role": "user", "content": 5}]}):
            self.assertEqual(error("/v1/chat/completions", bad), 400, bad)
        self.assertEqual(self.s.request("GET", "/nowhere")[0], 404)
        self.assertEqual(self.s.request("POST", "/health")[0], 404)


class KvEventsTest(unittest.TestCase):
    """Block events on PUB, their order and contents, eviction, clearing, drops and replay."""

    def start(self, *args):
        s = Standin("--model", "m", "--block-size", "4", "--cache-blocks", "4", "--decode-step-s", "0.001", *args)
        self.addCleanup(lambda: self.assertEqual(s.stop(), 0))
        return s

    def complete(self, s, prompt):
        status, body = s.post_json("/v1/completions", {"prompt": prompt, "max_tokens": 1})
        self.assertEqual(status, 200, body)
        return body["usage"]["prompt_tokens_details"]["cached_tokens"]

    def test_stores_evictions_and_clear_in_order(self):
        s = self.start()
        sub = subscriber(s.ready["kv_events"])
        a, a_longer, b = list(range(1, 9)), list(range(1, 14)), list(range(100, 112))
        a0, a1, a2 = engine_standin.block_hashes(a_longer, 4)
        b0, b1, b2 = engine_standin.block_hashes(b, 4)
        self.assertTrue(all(-2**63 <= h < 2**63 for h in (a0, a1, a2, b0, b1, b2)))
        self.assertEqual(len({a0, a1, a2, b0, b1, b2}), 6)

        self.assertEqual(self.complete(s, a), 0)
        self.assertEqual(batch(receive(sub)), (0, [["BlockStored", [a0, a1], None, a, 4, None, "GPU"]]))
        self.assertEqual(self.complete(s, a_longer), 8)
        self.assertEqual(batch(receive(sub)), (1, [["BlockStored", [a2], a1, [9, 10, 11, 12], 4, None, "GPU"]]))
        # 4 blocks: b's 3 evict 2, the tail of a first
        self.assertEqual(self.complete(s, b), 0)
        self.assertEqual(batch(receive(sub)), (2, [["BlockRemoved", [a2, a1], "GPU"],
                                                   ["BlockStored", [b0, b1, b2], None, b, 4, None, "GPU"]]))
        self.assertEqual(self.complete(s, a), 4)
        self.assertEqual(batch(receive(sub)), (3, [["BlockRemoved", [b2], "GPU"],
                                                   ["BlockStored", [a1], a0, [5, 6, 7, 8], 4, None, "GPU"]]))
        self.assertEqual(self.complete(s, a), 4)  # nothing changes: no batch
        self.assertEqual(s.stats()["cached_blocks"], 4)
        self.assertEqual(s.request("POST", "/standin/clear", {})[0], 200)
        self.assertEqual(batch(receive(sub)), (4, [["AllBlocksCleared"]]))
        stats = s.stats()
        self.assertEqual((stats["cached_blocks"], stats["batches_published"], stats["batches_dropped"]), (0, 5, 0))
        self.assertEqual(self.complete(s, a), 0)
        self.assertEqual(batch(receive(sub))[0], 5)
        sub.close()

    def test_dropped_batches_come_back_through_replay(self):
        s = self.start("--drop-batches", "1,2")
        sub = subscriber(s.ready["kv_events"])
        prompts = [[i] * 4 for i in range(1, 5)]
        for p in prompts:
            self.complete(s, p)
        seen = [receive(sub), receive(sub)]
        self.assertEqual([batch(f)[0] for f in seen], [0, 3])
        self.assertFalse(sub.poll(300))
        stats = s.stats()
        self.assertEqual((stats["batches_published"], stats["batches_dropped"]), (4, 2))

        dealer = zmq.Context.instance().socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(s.ready["kv_replay"])
        dealer.send_multipart([b"", (1).to_bytes(8, "big")])
        replayed = []
        while True:
            empty, seq, payload = receive(dealer)
            self.assertEqual(empty, b"")
            if seq == END_OF_REPLAY:
                self.assertEqual(payload, b"")
                break
            replayed.append(batch([b"", seq, payload]))
        self.assertEqual([seq for seq, _ in replayed], [1, 2, 3])
        for (seq, events), prompt in zip(replayed, prompts[1:]):
            self.assertEqual(events[-1][:4], ["BlockStored", engine_standin.block_hashes(prompt, 4), None, prompt])
        dealer.send_multipart([b"", (0).to_bytes(8, "big")])
        self.assertEqual(receive(dealer), [b""] + seen[0][1:])  # the same bytes as on PUB
        dealer.close()
        sub.close()

    def test_kv_events_off(self):
        s = Standin("--model", "m", "--kv-events", "off")
        self.addCleanup(lambda: self.assertEqual(s.stop(), 0))
        self.assertEqual((s.ready["kv_events"], s.ready["kv_replay"]), (None, None))
        self.complete(s, [1, 2, 3, 4, 5])
        self.assertEqual(s.stats()["batches_published"], 0)

    def test_drop_spec(self):
        every3 = engine_standin.parse_drops("every:3")
        self.assertEqual([q for q in range(10) if every3(q)], [2, 5, 8])
        listed = engine_standin.parse_drops("0,4")
        self.assertEqual([q for q in range(10) if listed(q)], [0, 4])


class TimingTest(unittest.TestCase):
    """Prefill time and its FIFO queue, decode pace, and a client that goes away."""

    def setUp(self):
        self.s = Standin("--model", "m", "--prefill-base-s", "0.01", "--prefill-s-per-token", "0.004",
                         "--decode-step-s", "0.01", "--kv-events", "off")
        self.addCleanup(lambda: self.assertEqual(self.s.stop(), 0))

    def timed(self, body):
        start = time.monotonic()
        status, answer = self.s.post_json("/v1/completions", body)
        self.assertEqual(status, 200)
        return time.monotonic() - start

    def test_prefill_is_serialized_and_cached_prompts_are_faster(self):
        prompts = [[7] * 100, [8] * 100]
        waiting = []
        threads = [threading.Thread(target=lambda p=p: waiting.append(self.timed({"prompt": p, "max_tokens": 1})))
                   for p in prompts]
        start = time.monotonic()
        for t in threads:
            t.start()
        deadline = time.monotonic() + 0.4  # the first prefill takes 0.41 s
        while self.s.stats()["waiting"] != 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        samples, _ = self.s.metrics()
        self.assertEqual(samples['vllm:num_requests_waiting{model_name="m"}'], 1)
        self.assertEqual(samples['vllm:num_requests_running{model_name="m"}'], 1)
        for t in threads:
            t.join(10)
        self.assertGreaterEqual(time.monotonic() - start, 2 * (0.01 + 100 * 0.004))
        self.assertGreaterEqual(min(waiting), 0.41)
        self.assertLess(self.timed({"prompt": prompts[0], "max_tokens": 1}), 0.3)  # 96 tokens cached: 0.026 s
        self.assertEqual(self.s.stats()["prefills"], 3)

    def test_decode_pace(self):
        self.assertGreaterEqual(self.timed({"prompt": [1, 2], "max_tokens": 21}), 0.2)

    def test_client_going_away_aborts(self):
        conn = self.s.connection()
        conn.request("POST", "/v1/completions", body=json.dumps({"prompt": [3, 4], "max_tokens": 2000, "stream": True}))
        answer = conn.getresponse()
        self.assertEqual(answer.status, 200)
        answer.read1(100)
        self.assertEqual(self.s.stats()["running"], 1)
        conn.sock.shutdown(2)
        conn.close()
        deadline = time.monotonic() + 3
        while self.s.stats()["running"] and time.monotonic() < deadline:
            time.sleep(0.02)
        stats = self.s.stats()
        self.assertEqual((stats["running"], stats["aborted"], stats["completions"]), (0, 1, 0))


class PdHandshakeTest(unittest.TestCase):
    """vLLM's toy-proxy P/D flow between a prefill and a decode stand-in."""

    @classmethod
    def setUpClass(cls):
        cls.prefill = Standin("--model", "m", "--role", "prefill", "--engine-id", "P1", "--decode-step-s", "0.001")
        cls.decode = Standin("--model", "m", "--role", "decode", "--engine-id", "D1", "--decode-step-s", "0.001")

    @classmethod
    def tearDownClass(cls):
        assert cls.prefill.stop() == 0 and cls.decode.stop() == 0

    def prefill_leg(self, prompt):
        status, body = self.prefill.post_json("/v1/completions", {
            "prompt": prompt, "max_tokens": 1, "stream": False,
            "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                                   "remote_block_ids": None, "remote_host": None, "remote_port": None}})
        self.assertEqual(status, 200, body)
        return body

    def test_prefill_then_decode(self):
        prompt = list(range(1000, 1040))
        before_p, before_d = self.prefill.stats(), self.decode.stats()
        body = self.prefill_leg(prompt)
        self.assertEqual(body["usage"]["completion_tokens"], 1)
        params = body["kv_transfer_params"]
        self.assertEqual((params["do_remote_prefill"], params["do_remote_decode"], params["remote_engine_id"],
                          params["remote_host"], params["remote_port"]),
                         (True, False, "P1", "127.0.0.1", self.prefill.port))
        self.assertEqual(len(params["remote_block_ids"]), 3)
        self.assertEqual(self.prefill.stats()["held_kv"], before_p["held_kv"] + 1)

        status, _, data = self.decode.request("POST", "/v1/completions", {
            "prompt": prompt, "max_tokens": 6, "stream": True, "kv_transfer_params": params})
        self.assertEqual(status, 200, data)
        events = sse_events(data)
        self.assertEqual("".join(e["choices"][0]["text"] for e in events[:-1]), expected_text(prompt, 6))
        after_p, after_d = self.prefill.stats(), self.decode.stats()
        self.assertEqual(after_p["prefills"], before_p["prefills"] + 1)
        self.assertEqual(after_p["held_kv"], before_p["held_kv"])
        self.assertEqual(after_d["prefills"], before_d["prefills"])
        self.assertEqual(after_d["remote_prefill_decodes"], before_d["remote_prefill_decodes"] + 1)
        self.assertGreater(after_d["cached_blocks"], before_d["cached_blocks"])  # the pulled KV is cached

        status, body = self.decode.post_json("/v1/completions", {"prompt": prompt, "kv_transfer_params": params})
        self.assertEqual(status, 400, body)  # pulled once only
        self.assertIn("error", body)

    def test_chat_over_pd(self):
        messages = [{"role": "user", "content": "over P/D"}]
        status, body = self.prefill.post_json("/v1/chat/completions", {
            "messages": messages, "max_tokens": 1, "kv_transfer_params": {"do_remote_decode": True}})
        self.assertEqual(status, 200, body)
        status, body = self.decode.post_json("/v1/chat/completions", {
            "messages": messages, "max_tokens": 4, "kv_transfer_params": body["kv_transfer_params"]})
        self.assertEqual(status, 200, body)
        self.assertEqual(body["choices"][0]["message"]["content"],
                         expected_text(list(b"<user>over P/D\n<assistant>"), 4))

    def test_decode_failures(self):
        params = self.prefill_leg([5, 6, 7, 8, 9])["kv_transfer_params"]
        for changes, status in (({"remote_request_id": "nobody"}, 400), ({"remote_engine_id": "P2"}, 400),
                                ({"remote_block_ids": [12345]}, 400), ({"remote_host": None}, 400)):
            answer = self.decode.post_json("/v1/completions", {"prompt": [5, 6, 7, 8, 9],
                                                               "kv_transfer_params": {**params, **changes}})
            self.assertEqual(answer[0], status, (changes, answer))
        answer = self.decode.post_json("/v1/completions", {"prompt": [5, 6, 7, 8, 10], "kv_transfer_params": params})
        self.assertEqual(answer[0], 400, answer)  # another prompt than the prefill's
        with socket_on_free_port() as port:
            answer = self.decode.post_json("/v1/completions", {"prompt": [5, 6, 7, 8, 9],
                                                               "kv_transfer_params": {**params, "remote_port": port}})
        self.assertEqual(answer[0], 500, answer)  # nobody listens there


class KvPoolTest(unittest.TestCase):
    """Two stand-ins sharing a pool stand-in (--kv-pool): what one computed, the other loads."""

    @classmethod
    def setUpClass(cls):
        cls.pool = Standin("pool")
        pool_url = cls.pool.ready["http"]
        cls.a = Standin("--model", "m", "--block-size", "4", "--kv-pool", pool_url, "--engine-id", "A",
                        "--prefill-s-per-token", "0.001", "--kv-pool-load-s-per-token", "0.0002")
        cls.b = Standin("--model", "m", "--block-size", "4", "--kv-pool", pool_url, "--engine-id", "B",
                        "--prefill-s-per-token", "0.001", "--kv-pool-load-s-per-token", "0.0002")

    @classmethod
    def tearDownClass(cls):
        assert cls.a.stop() == 0 and cls.b.stop() == 0 and cls.pool.stop() == 0

    def pool_stats(self):
        return json.loads(self.pool.request("GET", "/pool/stats")[2])

    def cached(self, standin, prompt):
        status, body = standin.post_json("/v1/completions", {"prompt": prompt, "max_tokens": 1})
        self.assertEqual(status, 200, body)
        return body["usage"]["prompt_tokens_details"]["cached_tokens"]

    def wait_for_pool_blocks(self, count):
        deadline = time.time() + 5  # a stand-in stores in the pool from a thread of its own
        while self.pool_stats()["blocks"] < count:
            self.assertLess(time.time(), deadline, "the pool did not get the blocks")
            time.sleep(0.02)

    def test_a_prefix_computed_on_one_is_loaded_by_the_other(self):
        base = self.pool_stats()["blocks"]
        prompt = list(range(2000, 2402))  # 100 full blocks of 4, and 2 tokens
        self.assertEqual(self.cached(self.a, prompt), 0)
        self.wait_for_pool_blocks(base + 100)
        before, _ = self.b.metrics()
        sub = subscriber(self.b.ready["kv_events"])
        self.assertEqual(self.cached(self.b, prompt), 400)  # all 100 blocks from the pool
        after, _ = self.b.metrics()
        label = '{model_name="m"}'
        self.assertEqual(after["vllm:external_prefix_cache_queries_total" + label]
                         - before["vllm:external_prefix_cache_queries_total" + label], 402)
        self.assertEqual(after["vllm:external_prefix_cache_hits_total" + label]
                         - before["vllm:external_prefix_cache_hits_total" + label], 400)
        self.assertEqual(after["vllm:prefix_cache_hits_total" + label]
                         - before["vllm:prefix_cache_hits_total" + label], 0)
        # B now caches the loaded blocks itself, and says so as vLLM does.
        _, events = batch(receive(sub))
        self.assertEqual([e[0] for e in events], ["BlockStored"])
        self.assertEqual(events[0][1], engine_standin.block_hashes(prompt, 4))
        sub.close()
        loaded = self.b.stats()["pool_hits_tokens"]
        self.assertEqual(self.cached(self.b, prompt), 400)
        self.assertEqual(self.b.stats()["pool_hits_tokens"], loaded)  # the second time from its own cache

    def test_the_pool_continues_a_local_prefix(self):
        base = self.pool_stats()["blocks"]
        shared = list(range(3000, 3040))  # 10 blocks
        self.cached(self.b, shared)  # B has 10 blocks itself (and stores them in the pool)
        self.wait_for_pool_blocks(base + 10)
        longer = shared + list(range(5000, 5041))  # 10 more blocks, and 1 token
        self.assertEqual(self.cached(self.a, longer), 40)  # B's 10 blocks, from the pool
        self.wait_for_pool_blocks(base + 20)
        before = self.b.stats()
        self.assertEqual(self.cached(self.b, longer), 80)  # 10 blocks local, 10 from the pool
        after = self.b.stats()
        self.assertEqual(after["prefix_hits_tokens"] - before["prefix_hits_tokens"], 40)
        self.assertEqual(after["pool_hits_tokens"] - before["pool_hits_tokens"], 40)
        self.assertEqual(after["pool_queries_tokens"] - before["pool_queries_tokens"], 81 - 40)

    def test_a_pool_that_is_gone_is_a_miss(self):
        with socket_on_free_port() as port:
            lone = Standin("--model", "m", "--block-size", "4", "--kv-pool", f"http://127.0.0.1:{port}")
            try:
                self.assertEqual(self.cached(lone, list(range(100, 140))), 0)
                self.assertGreater(lone.stats()["pool_failures"], 0)
            finally:
                self.assertEqual(lone.stop(), 0)

    def test_a_bad_pool_url_is_refused(self):
        for url in ("nope", "http://127.0.0.1", "http://127.0.0.1:99999", "tcp://127.0.0.1:5"):
            out = subprocess.run([sys.executable, os.path.join(HERE, "engine_standin.py"), "--model", "m",
                                  "--kv-pool", url], capture_output=True, text=True, timeout=20)
            self.assertEqual(out.returncode, 2, url)
            self.assertIn("--kv-pool must be http://HOST:PORT", out.stderr)

    def test_bad_pool_requests(self):
        for body in (b"nope", {"hashes": "x"}, {"hashes": [1, "2"]}, {}):
            status, _, data = self.pool.request("POST", "/pool/lookup", body)
            self.assertEqual(status, 400, data)
        self.assertEqual(self.pool.request("POST", "/pool/nothing", {"hashes": []})[0], 404)


class socket_on_free_port:
    """A port bound but not listening: connecting to it is refused."""

    def __enter__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        return self.sock.getsockname()[1]

    def __exit__(self, *exc):
        self.sock.close()


if __name__ == "__main__":
    unittest.main()
