"""`KVTransferConfig`: what `--kv-transfer-config` / `LLM(kv_transfer_config=...)` set.

Field names, roles and defaults are vLLM's. Values only; the connector classes are
looked up by name in `vllm/kv_transfer/factory.py`.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Optional

from vllm.utils.config_json import config_fields

KV_ROLES = ("kv_producer", "kv_consumer", "kv_both")


@dataclass
class KVTransferConfig:
    kv_connector: Optional[str] = None
    """The connector: ExampleConnector (files under a shared directory),
    P2pZmqConnector (TCP between a prefill and a decode instance) or
    OffloadingConnector (prefix-cache blocks kept in host memory; what
    --kv-offloading-size sets up)."""
    kv_role: Optional[str] = None
    """kv_producer (a prefill instance: saves the KV it computes), kv_consumer (a decode
    instance: loads KV computed elsewhere) or kv_both."""
    engine_id: Optional[str] = None
    """P2pZmqConnector: this engine's name in the kv_transfer_params it hands out
    (remote_engine_id; default kv_ip:kv_port)."""
    kv_ip: str = "127.0.0.1"
    """P2pZmqConnector: the address a producer's workers listen on (and announce)."""
    kv_port: int = 14579
    """P2pZmqConnector: the producer's first port; worker rank r listens on kv_port + r."""
    kv_buffer_size: float = 1e9
    """P2pZmqConnector: bytes of host memory a producer keeps for KV not yet fetched
    (the oldest entries are dropped beyond it)."""
    kv_connector_extra_config: dict[str, Any] = field(default_factory=dict)
    """Connector-specific options: ExampleConnector {"shared_storage_path": DIR};
    P2pZmqConnector {"timeout_s": seconds a fetch may take (default 30),
    "ttl_s": seconds a producer keeps unfetched KV (default 120)};
    OffloadingConnector {"cpu_bytes_to_use": host bytes, all ranks together}."""

    def __post_init__(self) -> None:
        from vllm.kv_transfer.factory import KVConnectorFactory
        if self.kv_connector is None:
            raise ValueError("kv_transfer_config.kv_connector is required; choose one of "
                             f"{', '.join(KVConnectorFactory.names())}.")
        KVConnectorFactory.check_name(self.kv_connector)
        if self.kv_role not in KV_ROLES:
            raise ValueError(f"kv_transfer_config.kv_role must be one of {', '.join(KV_ROLES)}"
                             f", got {self.kv_role!r}.")
        if not isinstance(self.kv_connector_extra_config, dict):
            raise ValueError("kv_transfer_config.kv_connector_extra_config must be a JSON "
                             "object.")
        if not isinstance(self.kv_port, int) or not 0 < self.kv_port < 65536:
            raise ValueError(f"kv_transfer_config.kv_port must be a TCP port, got "
                             f"{self.kv_port!r}.")
        if not self.kv_buffer_size > 0:
            raise ValueError("kv_transfer_config.kv_buffer_size must be > 0, got "
                             f"{self.kv_buffer_size!r}.")
        KVConnectorFactory.check_extra_config(self)

    @property
    def is_kv_producer(self) -> bool:
        return self.kv_role in ("kv_producer", "kv_both")

    @property
    def is_kv_consumer(self) -> bool:
        return self.kv_role in ("kv_consumer", "kv_both")

    def get_from_extra_config(self, key: str, default: Any) -> Any:
        return self.kv_connector_extra_config.get(key, default)

    @classmethod
    def from_cli(cls, value: Any) -> Optional["KVTransferConfig"]:
        """From the --kv-transfer-config JSON text, a dict, or an instance (None: off)."""
        if value is None or isinstance(value, cls):
            return value
        value = config_fields(value, "kv_transfer_config", (f.name for f in fields(cls)),
                              '{"kv_connector": "ExampleConnector", "kv_role": "kv_both"}')
        return cls(**value)

    def verify_with(self, vllm_config: Any) -> None:
        """Refuse what cannot run with KV transfer (ValueError naming the field)."""
        if self.kv_connector == "OffloadingConnector":
            _verify_offloading(vllm_config)
        if getattr(vllm_config.model_config, "runner_type", "generate") == "pooling":
            raise ValueError("kv_transfer_config: KV transfer serves generating models; a "
                             "pooling model keeps no KV cache between steps.")
        if (self.kv_connector == "P2pZmqConnector"
                and vllm_config.parallel_config.data_parallel_size > 1):
            raise ValueError("kv_transfer_config: P2pZmqConnector serves one engine per "
                             "kv_port; run one instance per data-parallel replica instead "
                             "of data_parallel_size > 1.")
        spec = getattr(vllm_config, "speculative_config", None)
        if spec is not None and spec.use_draft_model:
            raise ValueError("kv_transfer_config: a draft model keeps its own KV cache, which "
                             "the connectors do not transfer; use speculative method ngram.")


def engine_kv_transfer_config(value: Any, kv_offloading_size: Optional[float]
                              ) -> Optional[KVTransferConfig]:
    """The engine's connector: --kv-transfer-config's, or the OffloadingConnector that
    --kv-offloading-size stands for (one slot: not both)."""
    config = KVTransferConfig.from_cli(value)
    if kv_offloading_size is None:
        return config
    if config is not None:
        raise ValueError("kv_offloading_size and kv_transfer_config both want the engine's "
                         "KV connector; use one of them.")
    return offloading_transfer_config(kv_offloading_size)


def offloading_transfer_config(size_gib: float) -> KVTransferConfig:
    """What --kv-offloading-size (GiB, all ranks together) with the native backend
    stands for, as in vLLM: the OffloadingConnector in both roles."""
    return KVTransferConfig(kv_connector="OffloadingConnector", kv_role="kv_both",
                            kv_connector_extra_config={"cpu_bytes_to_use": size_gib * 2**30})


def _verify_offloading(vllm_config: Any) -> None:
    """What KV offloading does not cover, refused by name."""
    from vllm.platforms import current_platform
    if current_platform.is_cpu():
        raise ValueError("--kv-offloading-size (kv_offloading_size) is meaningless on CPU: "
                         "the KV cache already lives in host memory; give the KV cache "
                         "more memory instead (--kv-cache-memory-bytes or "
                         "VLLM_CPU_KVCACHE_SPACE).")
    if not vllm_config.cache_config.enable_prefix_caching:
        raise ValueError("kv_offloading_size: KV offloading keeps prefix-cache blocks in "
                         "host memory; it needs prefix caching (drop "
                         "--no-enable-prefix-caching).")
    if vllm_config.model_config.use_mla:
        raise ValueError("kv_offloading_size: KV offloading is not supported for MLA models "
                         "(DeepSeek-V2/V3 latent caches) here; drop --kv-offloading-size.")
