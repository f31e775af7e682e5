"""The run directory's CSV rows — ``levels.csv`` (:class:`LevelRow`), ``requests.csv`` (:class:`RequestRow`),
``accuracy.csv`` (:class:`AccuracyRow`) — and their column tuples; re-exported by :mod:`harness.rundir.schema`."""

from __future__ import annotations

from harness.rundir.record import Record as _Record

class LevelRow(_Record):
    """One ``levels.csv`` row: vLLM's level result (``vllm bench serve`` JSON) plus what dsa-bench measured around it.

    ``level`` is the level's id (``str(Level)``: dataset, input and output length, concurrency; schema 2 files,
    which lack it, get it on read from the scenario's one regime, :mod:`harness.rundir.v2`), ``concurrency`` its
    concurrency (kept as its own column for readers of the CSV).

    ``client_cpu_util`` = benchmark client CPU seconds / level wall seconds; ``max_concurrent_requests`` is vLLM's.
    ``host_steal_fraction`` = stolen / all CPU ticks of the host between the level's start and end (0..1) and
    ``load_avg_1m`` the 1-minute load average at its end (harness.run.host_load; empty in older run directories and
    where ``/proc`` is absent). ``engine_cpu_ms_per_token`` = the vLLM engine processes' (EngineCore and its workers)
    user + system CPU milliseconds over the level / its output tokens (harness.run.host_load; empty for remote
    servers and older run directories). ``request_goodput`` (req/s) and ``slo_attainment`` (0..1): vLLM's goodput of
    the scenario's ``[slo]`` and the share of requests meeting it (:func:`harness.run.load.parse_bench_result`; empty
    without ``[slo]``).
    MTP columns (empty with MTP off): drafts, draft tokens, accepted tokens (counts over the measured window);
    ``acceptance_rate`` = accepted / draft tokens (0..1); ``acceptance_length`` = 1 + accepted / drafts;
    ``acceptance_per_pos`` = per-position rates, ``;``-joined.
    Server columns (empty where the raw result has no ``/metrics`` captures; :mod:`harness.run.server_metrics`), over
    the same measured window: ``server_mean_{ttft,tpot,itl,e2el}_ms`` = Δsum / Δcount of vLLM's histograms (ms;
    the server's TPOT is its decode time / (tokens − 1) per request), ``server_requests`` finished requests,
    ``server_generation_tokens`` generated tokens, ``engine_steps`` engine steps that emitted output,
    ``engine_steps_per_s`` = engine_steps / duration_s and ``tokens_per_step`` = server_generation_tokens /
    engine_steps (their product is the output throughput); ``prefix_cache_queries`` / ``prefix_cache_hits`` the
    prompt tokens looked up in / found in the arm's prefix cache and ``prefix_cache_hit_rate`` their ratio (0..1).
    """

    arm: str
    session: int | None = None
    round: int
    level: str                                  # str(harness.rundir.schema.Level): regime and concurrency
    concurrency: int
    completed: int
    failed: int
    duration_s: float | None = None
    output_throughput: float | None = None
    total_token_throughput: float | None = None
    request_throughput: float | None = None
    mean_ttft_ms: float | None = None
    median_ttft_ms: float | None = None
    p99_ttft_ms: float | None = None
    mean_tpot_ms: float | None = None
    median_tpot_ms: float | None = None
    p99_tpot_ms: float | None = None
    mean_itl_ms: float | None = None
    p99_itl_ms: float | None = None
    mean_e2el_ms: float | None = None
    max_concurrent_requests: float | None = None
    client_cpu_util: float | None = None
    host_steal_fraction: float | None = None   # stolen / all CPU ticks of the host over the level (/proc/stat)
    load_avg_1m: float | None = None            # the host's 1-minute load average at the level's end (/proc/loadavg)
    engine_cpu_ms_per_token: float | None = None  # the engine's user + system CPU ms / output token over the level
    request_goodput: float | None = None        # requests meeting every [slo] / duration (req/s; vLLM's --goodput)
    slo_attainment: float | None = None         # the share of completed requests meeting every [slo] (0..1)
    server_mean_ttft_ms: float | None = None
    server_mean_tpot_ms: float | None = None
    server_mean_itl_ms: float | None = None
    server_mean_e2el_ms: float | None = None
    server_requests: float | None = None
    server_generation_tokens: float | None = None
    engine_steps: float | None = None
    engine_steps_per_s: float | None = None
    tokens_per_step: float | None = None
    prefix_cache_queries: float | None = None   # prompt tokens looked up in the arm's prefix cache over the window
    prefix_cache_hits: float | None = None      # of those, tokens found cached
    prefix_cache_hit_rate: float | None = None  # hits / queries (0..1)
    spec_drafts: float | None = None
    spec_draft_tokens: float | None = None
    spec_accepted_tokens: float | None = None
    acceptance_rate: float | None = None
    acceptance_length: float | None = None
    acceptance_per_pos: str | None = None


class RequestRow(_Record):
    """One ``requests.csv`` row. TTFT and E2EL from vLLM's ``ttfts``/``latencies`` (ms); ``output_len`` counted by
    the server; ``tpot_ms`` = (E2EL − TTFT) / (output_len − 1) for output_len > 1, else empty; ``start_s`` relative
    to the level's first request; ``error`` empty on success."""

    arm: str
    session: int | None = None
    round: int
    level: str                                  # the level the request was sent in (str(Level))
    concurrency: int
    index: int
    input_len: int
    output_len: int
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2el_ms: float | None = None
    start_s: float | None = None
    error: str = ""
    max_itl_ms: float | None = None             # the largest inter-token gap (vLLM's ``itls``); empty if not recorded


class AccuracyRow(_Record):
    """One ``accuracy.csv`` row: ``question_id`` is lm-eval's ``doc_id`` (0-based index into test.jsonl),
    ``correct`` 0/1 under ``filter`` ("strict-match" | "flexible-extract"), ``prompt_hash`` lm-eval's."""

    arm: str
    question_id: int
    filter: str
    correct: int
    extracted: str | None = None
    target: str | None = None
    prompt_hash: str | None = None


LEVEL_COLUMNS: tuple[str, ...] = tuple(LevelRow.model_fields)
REQUEST_COLUMNS: tuple[str, ...] = tuple(RequestRow.model_fields)
ACCURACY_COLUMNS: tuple[str, ...] = tuple(AccuracyRow.model_fields)
MTP_COLUMNS: tuple[str, ...] = LEVEL_COLUMNS[LEVEL_COLUMNS.index("spec_drafts"):]
REQUIRED_LEVEL_COLUMNS: tuple[str, ...] = ("arm", "round", "level", "concurrency", "completed", "failed")
REQUIRED_REQUEST_COLUMNS: tuple[str, ...] = ("arm", "round", "level", "concurrency", "output_len", "ttft_ms", "tpot_ms",
                                             "e2el_ms", "start_s", "error")
REQUIRED_ACCURACY_COLUMNS: tuple[str, ...] = ("arm", "question_id", "filter", "correct")

