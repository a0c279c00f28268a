"""``GET /metrics``: the server's state in Prometheus's text format, made by prometheus-client from the scheduler's
counters at each scrape (llama-server's set, named ``kleidipy_*``): prompt and generated tokens, requests, time
spent in forward passes (so ``rate()`` gives tokens/s), forward passes and the sequences they ran (their ratio
is the mean batch), busy slots, queue depth and KV cache usage."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from kleidipy.server.scheduler import Scheduler

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class SchedulerCollector:
    """Reads one scheduler's counters and slots when Prometheus scrapes."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler

    def collect(self) -> Iterator[Metric]:
        s = self.scheduler
        stats = s.stats
        yield CounterMetricFamily("kleidipy_prompt_tokens", "Prompt tokens processed", value=stats.prompt_tokens)
        yield CounterMetricFamily("kleidipy_tokens_predicted", "Tokens generated", value=stats.predicted_tokens)
        yield CounterMetricFamily("kleidipy_requests", "Generations finished (any reason)", value=stats.requests)
        yield CounterMetricFamily(
            "kleidipy_forward_seconds", "Seconds spent in forward passes", value=stats.forward_seconds
        )
        yield CounterMetricFamily("kleidipy_forward_passes", "Forward passes run", value=stats.forward_passes)
        yield CounterMetricFamily(
            "kleidipy_forward_sequences",
            "Sequences run by the forward passes (a batch counts each)",
            value=stats.forward_sequences,
        )
        yield GaugeMetricFamily("kleidipy_requests_processing", "Slots generating", value=s.busy)
        yield GaugeMetricFamily("kleidipy_requests_deferred", "Requests waiting for a slot", value=s.queued)
        used = sum(slot.cache.n_past for slot in s.slots if slot.job is not None)
        total = sum(slot.cache.n_ctx for slot in s.slots)
        yield GaugeMetricFamily("kleidipy_kv_cache_usage_ratio", "KV cache cells in use", value=used / total)


def metrics_text(scheduler: Scheduler) -> bytes:
    """The exposition text for ``scheduler``."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SchedulerCollector(scheduler))
    return generate_latest(registry)
