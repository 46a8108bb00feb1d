"""/metrics: counters in Prometheus' text exposition format."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..facade import Completion
    from .slots import ModelSlot


CLIENT_GONE_STATUS = 499                 # nginx's "client closed request"


def _label(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


@dataclass
class Metrics:
    """Counters in Prometheus' text exposition format; touched only on the event loop."""
    requests: dict[tuple[str, int], int] = field(default_factory=dict)
    latency: dict[str, list[float]] = field(default_factory=dict)    # endpoint -> [sum, n]
    prompt_tokens: dict[str, int] = field(default_factory=dict)
    cached_tokens: dict[str, int] = field(default_factory=dict)
    generated_tokens: dict[str, int] = field(default_factory=dict)
    cancelled: dict[str, int] = field(default_factory=dict)

    def request(self, endpoint: str, status: int, seconds: float) -> None:
        self.requests[endpoint, status] = self.requests.get((endpoint, status), 0) + 1
        s = self.latency.setdefault(endpoint, [0.0, 0])
        s[0] += seconds
        s[1] += 1

    def generation(self, model: str, out: Completion) -> None:
        def add(d: dict, n: int) -> None:
            d[model] = d.get(model, 0) + n
        add(self.prompt_tokens, len(out.prompt_tokens))
        add(self.cached_tokens, int(out.timings.get("cached_tokens", 0)))
        add(self.generated_tokens, len(out.tokens))
        add(self.cancelled, out.finish_reason == "cancelled")

    def render(self, models: dict[str, "ModelSlot"]) -> str:
        lines: list[str] = []

        def family(name: str, kind: str, help_: str, samples) -> None:
            lines.append(f"# HELP {name} {help_}")
            lines.append(f"# TYPE {name} {kind}")
            for labels, value in samples:
                text = ",".join(f'{k}="{_label(str(v))}"' for k, v in labels.items())
                lines.append(f"{name}{{{text}}} {value}" if text else f"{name} {value}")

        family("hotseat_requests_total", "counter", "HTTP requests by endpoint and status.",
               [({"endpoint": e, "status": s}, n) for (e, s), n in sorted(self.requests.items())])
        lat = sorted(self.latency.items())
        lines.append("# HELP hotseat_request_duration_seconds Time from request to the last "
                     "byte of the response.")
        lines.append("# TYPE hotseat_request_duration_seconds summary")
        for e, (total, n) in lat:
            lines.append(f'hotseat_request_duration_seconds_sum{{endpoint="{_label(e)}"}} '
                         f"{total:.6f}")
            lines.append(f'hotseat_request_duration_seconds_count{{endpoint="{_label(e)}"}} {n}')
        for name, d, help_ in (
                ("hotseat_prompt_tokens_total", self.prompt_tokens, "Prompt tokens processed."),
                ("hotseat_cached_prompt_tokens_total", self.cached_tokens,
                 "Prompt tokens whose KV was reused from the previous request."),
                ("hotseat_generated_tokens_total", self.generated_tokens, "Tokens generated."),
                ("hotseat_generations_cancelled_total", self.cancelled,
                 "Generations stopped early: the client went away or the server stopped.")):
            family(name, "counter", help_, [({"model": m}, n) for m, n in sorted(d.items())])
        family("hotseat_models_loaded", "gauge", "Models loaded.", [({}, len(models))])
        family("hotseat_queue_depth", "gauge", "Requests running or waiting, by model.",
               [({"model": m}, s.depth) for m, s in sorted(models.items())])
        return "\n".join(lines) + "\n"
