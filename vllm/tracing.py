"""OpenTelemetry request tracing (--otlp-traces-endpoint): one span per finished request.

The span is vLLM's: named "llm_request", kind SERVER, from the request's arrival to its
end, a child of the client's trace when the HTTP request carried W3C trace context
(`traceparent` / `tracestate`), with vLLM's attribute names (gen_ai.request.* sampling
parameters, gen_ai.usage.* token counts, gen_ai.latency.* breakdown). Spans are batched
and exported over OTLP/HTTP (protobuf) by the SDK's exporter; the OTEL_EXPORTER_OTLP_*
variables (headers, timeout, ...) configure it as usual.

Nothing here imports opentelemetry until a tracer is built: with tracing off (the
default) the SDK is never loaded and a request costs one `None` check.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Mapping, Optional

from vllm import envs

if TYPE_CHECKING:
    from vllm.engine.output_processor import ParentRequest

logger = logging.getLogger(__name__)

TRACE_HEADERS = ("traceparent", "tracestate")
SPAN_NAME = "llm_request"


class SpanAttributes:
    """vLLM's attribute names (OpenTelemetry's gen-ai conventions, plus its own)."""
    GEN_AI_USAGE_COMPLETION_TOKENS = "gen_ai.usage.completion_tokens"
    GEN_AI_USAGE_PROMPT_TOKENS = "gen_ai.usage.prompt_tokens"
    GEN_AI_USAGE_NUM_SEQUENCES = "gen_ai.usage.num_sequences"
    GEN_AI_REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
    GEN_AI_REQUEST_TOP_P = "gen_ai.request.top_p"
    GEN_AI_REQUEST_TEMPERATURE = "gen_ai.request.temperature"
    GEN_AI_REQUEST_ID = "gen_ai.request.id"
    GEN_AI_REQUEST_N = "gen_ai.request.n"
    GEN_AI_RESPONSE_MODEL = "gen_ai.response.model"
    GEN_AI_LATENCY_TIME_IN_QUEUE = "gen_ai.latency.time_in_queue"
    GEN_AI_LATENCY_TIME_TO_FIRST_TOKEN = "gen_ai.latency.time_to_first_token"
    GEN_AI_LATENCY_E2E = "gen_ai.latency.e2e"
    GEN_AI_LATENCY_TIME_IN_SCHEDULER = "gen_ai.latency.time_in_scheduler"
    GEN_AI_LATENCY_TIME_IN_MODEL_PREFILL = "gen_ai.latency.time_in_model_prefill"
    GEN_AI_LATENCY_TIME_IN_MODEL_DECODE = "gen_ai.latency.time_in_model_decode"
    GEN_AI_LATENCY_TIME_IN_MODEL_INFERENCE = "gen_ai.latency.time_in_model_inference"


def extract_trace_headers(headers: Mapping[str, str]) -> Optional[dict[str, str]]:
    """The W3C trace-context headers of an HTTP request (None when it has none)."""
    found = {h: headers[h] for h in TRACE_HEADERS if h in headers}
    return found or None


def request_attributes(parent: "ParentRequest", model_name: str) -> dict[str, Any]:
    """The span's attributes for a finished request (None values left out)."""
    m, params = parent.metrics, parent.params
    end = m.finished_time or m.last_token_time or m.arrival_time
    scheduled, first, last = m.first_scheduled_time, m.first_token_time, m.last_token_time
    a = SpanAttributes
    attrs: dict[str, Any] = {
        a.GEN_AI_RESPONSE_MODEL: model_name,
        a.GEN_AI_REQUEST_ID: parent.request_id,
        a.GEN_AI_REQUEST_N: params.n,
        a.GEN_AI_REQUEST_TEMPERATURE: params.temperature,
        a.GEN_AI_REQUEST_TOP_P: params.top_p,
        a.GEN_AI_REQUEST_MAX_TOKENS: params.max_tokens,
        a.GEN_AI_USAGE_PROMPT_TOKENS: len(parent.prompt_token_ids),
        a.GEN_AI_USAGE_COMPLETION_TOKENS: sum(len(c.token_ids) for c in parent.children),
        a.GEN_AI_USAGE_NUM_SEQUENCES: len(parent.children),
        a.GEN_AI_LATENCY_E2E: end - m.arrival_time,
        a.GEN_AI_LATENCY_TIME_IN_QUEUE: m.time_in_queue,
        a.GEN_AI_LATENCY_TIME_TO_FIRST_TOKEN: (first - m.arrival_time
                                               if first is not None else None),
        a.GEN_AI_LATENCY_TIME_IN_MODEL_PREFILL: (first - scheduled if first is not None
                                                 and scheduled is not None else None),
        a.GEN_AI_LATENCY_TIME_IN_MODEL_DECODE: (last - first if last is not None
                                                and first is not None else None),
        a.GEN_AI_LATENCY_TIME_IN_MODEL_INFERENCE: (last - scheduled if last is not None
                                                   and scheduled is not None else None),
    }
    return {k: v for k, v in attrs.items() if v is not None}


class RequestTracer:
    """Emits one span per finished request to an OTLP/HTTP collector."""

    def __init__(self, endpoint: str, model_name: str, exporter: Any = None) -> None:
        """`exporter`: a SpanExporter to use instead of OTLP/HTTP (tests)."""
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.trace import SpanKind
        from opentelemetry.trace.propagation.tracecontext import \
            TraceContextTextMapPropagator
        if exporter is None:
            exporter = _otlp_http_exporter(endpoint)
        self._provider = TracerProvider()  # OTEL_SERVICE_NAME etc. read by the SDK
        self._provider.add_span_processor(BatchSpanProcessor(exporter))
        self._tracer = self._provider.get_tracer("vllm.llm_engine")
        self._propagator = TraceContextTextMapPropagator()
        self._kind = SpanKind.SERVER
        self.model_name = model_name
        logger.info("Tracing requests to %s (OTLP/HTTP)", endpoint)

    def trace_request(self, parent: "ParentRequest") -> None:
        """One span for a finished request, a child of the client's trace if any."""
        context = (self._propagator.extract(parent.trace_headers)
                   if parent.trace_headers else None)
        m = parent.metrics
        end = m.finished_time or m.last_token_time or m.arrival_time
        span = self._tracer.start_span(SPAN_NAME, context=context, kind=self._kind,
                                       start_time=int(m.arrival_time * 1e9),
                                       attributes=request_attributes(parent, self.model_name))
        span.end(end_time=int(end * 1e9))

    def shutdown(self) -> None:
        """Export what is still batched, then stop."""
        self._provider.shutdown()


def _otlp_http_exporter(endpoint: str) -> Any:
    protocol = envs.OTEL_EXPORTER_OTLP_TRACES_PROTOCOL
    if protocol not in ("http/protobuf", ""):
        raise ValueError(f"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL={protocol!r}: this server "
                         "exports traces over OTLP/HTTP only (http/protobuf; the gRPC "
                         "exporter is not installed). Point --otlp-traces-endpoint at the "
                         "collector's HTTP port, e.g. http://localhost:4318/v1/traces.")
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    return OTLPSpanExporter(endpoint=endpoint)


def init_tracer(observability_config: Any, model_name: str) -> Optional[RequestTracer]:
    """A RequestTracer when --otlp-traces-endpoint is set, else None (no import)."""
    endpoint = getattr(observability_config, "otlp_traces_endpoint", None)
    if not endpoint:
        return None
    return RequestTracer(endpoint, model_name)
