"""Build and run the gRPC server: AuditService, WorkerService, health, reflection, dispatcher."""

from __future__ import annotations

import logging
from concurrent import futures
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from service.auth import Authenticator, AuthInterceptor, bind_port, check_exposure
from service.blobs import BlobStore
from service.capacity import Capacity, CapacityInterceptor, CapacityLimits
from service.config import ServerConfig
from service.decode_guard import DecodeGuardInterceptor
from service.dispatch import Dispatcher, Sender, broker_epoch, celery_sender
from service.errors_interceptor import ErrorsInterceptor
from service.housekeeping import Housekeeper
from service.jobs import JobService, ReportSealer
from service.listen import host_of, why_not_listening
from service.metrics import ServiceMetrics, active, counted_signer, watch_store
from service.metrics_interceptor import metrics_interceptors
from service.plans import Planner, no_planner
from service.quotas import Quotas
from service.servicer import AuditServicer, WorkerServicer
from service.store import JobStore
from xaudit.contract.errors import InvalidInput, Unavailable
from xaudit.v1 import audit_pb2, audit_pb2_grpc, worker_pb2, worker_pb2_grpc

__all__ = ["Server", "create_server", "default_signer"]

logger = logging.getLogger(__name__)

SERVICE_NAMES = (
    audit_pb2.DESCRIPTOR.services_by_name["AuditService"].full_name,
    worker_pb2.DESCRIPTOR.services_by_name["WorkerService"].full_name,
)


def default_signer(config: ServerConfig) -> ReportSealer:
    """The report signer: keys under ``config.signing_key_dir`` (made on first start), or a key file."""
    from service.signing import ReportSigner

    return ReportSigner(config.resolved_signing_key_dir, key_file=config.signing_key_file)


def _advertised(config: ServerConfig, port: int) -> str:
    if config.advertise:
        return config.advertise
    host = host_of(config.listen)
    if host in ("", "0.0.0.0", "::"):
        host = "127.0.0.1"
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class Server:
    """A started-or-not xaudit server; :meth:`stop` drains (health NOT_SERVING first)."""

    def __init__(
        self,
        config: ServerConfig,
        grpc_server: grpc.Server,
        port: int,
        jobs: JobService,
        dispatcher: Dispatcher,
        health_servicer: health.HealthServicer,
        closers: list[Any],
        housekeeper: Housekeeper | None = None,
    ) -> None:
        self.config = config
        self.grpc = grpc_server
        self.port = port
        self.address = _advertised(config, port)
        self.jobs = jobs
        self.dispatcher = dispatcher
        self._health = health_servicer
        self._closers = closers
        self._housekeeper = housekeeper
        # Set by create_server when authentication is on: what the embedded local worker presents.
        self.worker_token: str | None = None

    @property
    def store(self) -> JobStore:
        return self.jobs.store

    def start(self) -> None:
        self.grpc.start()
        self.dispatcher.start()
        if self._housekeeper is not None:
            self._housekeeper.start()
        for name in ("", *SERVICE_NAMES):
            self._health.set(name, health_pb2.HealthCheckResponse.SERVING)
        logger.info("xaudit serving on %s (store %s)", self.address, self.config.resolved_store_url)

    def stop(self, grace: float | None = None) -> None:
        self._health.enter_graceful_shutdown()
        self.dispatcher.stop()
        if self._housekeeper is not None:
            self._housekeeper.stop()
        self.grpc.stop(self.config.grace_seconds if grace is None else grace).wait()
        for close in self._closers:
            try:
                close()
            except Exception:
                logger.exception("error while closing")
        logger.info("xaudit server on %s stopped", self.address)

    def wait_for_termination(self, timeout: float | None = None) -> bool:
        return bool(self.grpc.wait_for_termination(timeout))


def create_server(
    config: ServerConfig,
    *,
    sender: Sender | None = None,
    signer: ReportSealer | None = None,
    metrics: ServiceMetrics | None = None,
    planner: Planner = no_planner,
) -> tuple[Server, int]:
    """Build the server bound to ``config.listen`` (port 0: any free port); returns it and its port.
    ``metrics``: where the server records (default: the entry point's activated metrics, if any).
    ``planner``: prices PlanAudit requests (the engine's, passed in by the CLI; default: refuse)."""
    metrics = metrics if metrics is not None else active()
    authenticator = Authenticator(config)
    check_exposure(config, authenticator)
    reason = why_not_listening(config.listen)
    if reason is not None:  # worded here; grpc's bind below still refuses a port taken since
        raise Unavailable(f"cannot listen on {config.listen}: {reason}")
    try:
        config.home.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InvalidInput(f"cannot create the data directory {config.home}: {exc.strerror}") from None
    store = JobStore(config.resolved_store_url)
    blobs = BlobStore(config.blob_dir)
    options = [
        ("grpc.max_receive_message_length", config.max_message_bytes),
        ("grpc.max_send_message_length", config.max_message_bytes),
        # grpc sets SO_REUSEPORT by default: a second server on a port in use would bind silently and
        # take a share of the first one's connections (its clients' jobs answered by another store).
        ("grpc.so_reuseport", 0),
    ]
    limits = CapacityLimits(
        config.grpc_threads,
        config.client_queue,
        config.max_streams,
        config.max_streams_per_tenant,
        config.worker_threads,
    )
    server = grpc.server(
        # Threads for every class of call at its cap (service.capacity): workers always find one.
        futures.ThreadPoolExecutor(max_workers=limits.pool_threads, thread_name_prefix="xaudit-rpc"),
        # Errors outside auth: its Unauthenticated / PermissionDenied become statuses.
        interceptors=[
            *metrics_interceptors(metrics),
            ErrorsInterceptor(),
            AuthInterceptor(authenticator),
            CapacityInterceptor(Capacity(limits)),  # streams counted per authenticated tenant
            DecodeGuardInterceptor(),  # undecodable bytes: INVALID_ARGUMENT, not grpc's INTERNAL
        ],
        options=options,
    )
    try:
        port = bind_port(server, config, authenticator)
    except RuntimeError:  # grpc >= 1.50 raises where older versions returned port 0
        port = 0
    if port == 0:
        store.close()
        raise Unavailable(f"cannot listen on {config.listen} (address in use or not valid)")
    closers: list[Any] = []
    address = _advertised(config, port)
    own_sender = sender is None
    if sender is None:
        sender, close_sender = celery_sender(config.resolved_broker_url, address)
        closers.append(close_sender)
    closers.append(store.close)
    watch_store(metrics, store)
    epoch = broker_epoch(config.resolved_broker_url) if own_sender else None
    dispatcher = Dispatcher(store, sender, config, epoch)
    jobs = JobService(
        config,
        store,
        dispatcher,
        counted_signer(metrics, signer if signer is not None else default_signer(config)),
        Quotas(store, authenticator.policy),
        metrics,
    )
    audit_pb2_grpc.add_AuditServiceServicer_to_server(AuditServicer(jobs, blobs, planner), server)
    worker_pb2_grpc.add_WorkerServiceServicer_to_server(WorkerServicer(jobs, blobs), server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    if config.reflection:
        from grpc_reflection.v1alpha import reflection

        reflection.enable_server_reflection(
            (*SERVICE_NAMES, health.SERVICE_NAME, reflection.SERVICE_NAME), server
        )
    housekeeper = Housekeeper(
        blobs, store.model_digests, config.orphan_sweep_seconds, config.orphan_grace_seconds
    )
    built = Server(config, server, port, jobs, dispatcher, health_servicer, closers, housekeeper)
    built.worker_token = authenticator.internal_worker_token  # for the embedded local worker only
    return built, port
