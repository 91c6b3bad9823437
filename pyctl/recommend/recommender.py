"""The periodic resource-normalization report of the controller in observe mode.

Every `interval` seconds: the controller's view (the cache's records, the reconciler's per-node
models) and, when configured, GPU usage from Prometheus become a `Report`
(`pyctl.recommend.report.recommend`), kept as `last_report`, summarised in one log line and
exported as metrics (`pyctl_recommend_*`). Nothing is changed and no Kubernetes Event is written.
A failure (Prometheus unreachable, a bad record) is counted and logged once per message; the next
tick tries again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import anyio
import anyio.to_thread

from pyctl.cluster.records import NodeRecord, NrtRecord, PodRecord
from pyctl.controller.cache import ClusterCache
from pyctl.controller.reconcile import Reconciler
from pyctl.jsontypes import JsonObject
from pyctl.metrics import Metrics
from pyctl.model import Node
from pyctl.recommend.inventory import from_records
from pyctl.recommend.prometheus import (
    PrometheusClient,
    PrometheusError,
    UsageReport,
    parse_duration,
    read_usage,
)
from pyctl.recommend.report import Options, Report, recommend

log = logging.getLogger("pyctl.recommend")

View = tuple[list[NodeRecord], list[PodRecord], list[NrtRecord], dict[str, Node]]


class Recommender:
    def __init__(
        self,
        cache: ClusterCache,
        reconciler: Reconciler,
        metrics: Metrics,
        cluster: str,
        options: Options | None = None,
        usage: Callable[[], UsageReport] | None = None,
    ) -> None:
        self.cache = cache
        self.reconciler = reconciler
        self.metrics = metrics.recommend
        self.cluster = cluster
        self.options = options or Options()
        self.usage = usage
        self.last_report: Report | None = None
        self.last_error = ""
        self._exported: dict[str, set[tuple[str, ...]]] = {}
        self._now: dict[str, set[tuple[str, ...]]] = {}
        self._logged: set[str] = set()

    def view(self) -> View:
        """A copy of what the report reads (records and models are immutable)."""
        c = self.cache
        return (
            list(c.nodes.values()),
            list(c.pods.values()),
            list(c.nrts.values()),
            dict(self.reconciler.models),
        )

    def read_usage(self) -> tuple[UsageReport | None, str]:
        if self.usage is None:
            return None, ""
        try:
            return self.usage(), ""
        except (PrometheusError, ValueError) as e:
            return None, f"usage not read: {e}"

    def compute(self, view: View, usage: UsageReport | None) -> Report:
        nodes, pods, nrts, models = view
        inv = from_records(
            nodes,
            pods,
            nrts,
            current=models,
            default_policy=self.reconciler.default_policy,
        )
        return recommend(inv, usage, self.options)

    def tick(self) -> Report | None:
        """One report, synchronously (tests; the loop uses `run`)."""
        t0 = time.perf_counter()
        usage, err = self.read_usage()
        try:
            report = self.compute(self.view(), usage)
        except Exception as e:  # a report must never stop the controller
            self._failed(str(e))
            return None
        self._done(report, err, time.perf_counter() - t0)
        return report

    async def run(self, interval: float, first: float = 10.0) -> None:
        """Report every ``interval`` seconds (the first after ``min(first, interval)``)."""
        await anyio.sleep(min(first, interval))
        while True:
            t0 = time.perf_counter()
            usage, err = await anyio.to_thread.run_sync(self.read_usage)
            view = self.view()
            try:
                report = await anyio.to_thread.run_sync(self.compute, view, usage)
            except Exception as e:
                self._failed(str(e))
            else:
                self._done(report, err, time.perf_counter() - t0)
            await anyio.sleep(interval)

    def _failed(self, message: str) -> None:
        self.metrics.runs.labels(self.cluster, "error").inc()
        self.last_error = message
        if message not in self._logged:
            self._logged.add(message)
            log.error("recommendation failed", extra={"error": message})

    def _done(self, report: Report, usage_error: str, seconds: float) -> None:
        self.last_report = report
        self.last_error = usage_error
        m, c = self.metrics, self.cluster
        m.runs.labels(c, "ok").inc()
        m.last_success.labels(c).set(time.time())
        m.duration.labels(c).set(seconds)
        self._export(report)
        if usage_error and usage_error not in self._logged:
            self._logged.add(usage_error)
            log.warning("recommendation without usage", extra={"error": usage_error})
        log.info("recommendation", extra={"report": summary(report)})

    def _set(self, gauge: Any, name: str, labels: tuple[str, ...], value: float) -> None:
        gauge.labels(self.cluster, *labels).set(value)
        self._now.setdefault(name, set()).add(labels)

    def _export(self, r: Report) -> None:
        m = self.metrics
        self._now = {}
        gauges = {
            "menu": m.menu_sizes,
            "served": m.served,
            "waste": m.waste,
            "workloads": m.workloads,
            "classes": m.class_nodes,
        }
        for p in r.pools:
            model = p.pool.gpu_model
            t = p.tradeoff
            rec = t.recommended
            self._set(m.menu_sizes, "menu", (model,), 0 if rec is None else rec.sizes)
            self._set(m.served, "served", (model, "requested"), t.baseline.served_pct / 100)
            for k, row in enumerate(t.rows, 1):
                self._set(m.served, "served", (model, str(k)), row.served_pct / 100)
            if rec is not None:
                self._set(m.waste, "waste", (model,), rec.observed_waste_pct / 100)
        changes = len(r.changes)
        self._set(m.workloads, "workloads", ("change",), changes)
        self._set(m.workloads, "workloads", ("keep",), len(r.workloads) - changes)
        for rc in r.classes.classes:
            self._set(m.class_nodes, "classes", (rc.pool or "cpu", rc.name), len(rc.nodes))
        c = self.cluster
        bad = sum(r.usage.bad_points.values()) if r.usage else 0
        m.usage_bad_points.labels(c).set(bad)
        stale = len(r.attribution.stale_series_pods) if r.attribution else 0
        m.usage_stale_pods.labels(c).set(stale)
        # label sets of pools, k's and classes that are gone
        for name, gauge in gauges.items():
            for labels in self._exported.get(name, set()) - self._now.get(name, set()):
                gauge.remove(c, *labels)
        self._exported = self._now


def summary(r: Report) -> JsonObject:
    """The report in one log line: menus, changes, classes."""
    return {
        "menus": {
            p.pool.gpu_model: list(p.tradeoff.recommended.menu or ())
            if p.tradeoff.recommended
            else []
            for p in r.pools
        },
        "workloads": len(r.workloads),
        "changes": len(r.changes),
        "classes": {f"{rc.pool or 'cpu'}/{rc.name}": len(rc.nodes) for rc in r.classes.classes},
        "problems": len(r.problems),
    }


def attach(
    ctl: Any,
    interval: float,
    *,
    options: Options | None = None,
    prometheus_url: str = "",
    window: str = "7d",
) -> Recommender:
    """A `Recommender` on a `pyctl.controller.controller.Controller`, its loop added to the
    controller's background tasks."""
    usage = None
    if prometheus_url:
        client = PrometheusClient(prometheus_url)
        seconds = parse_duration(window)

        def usage() -> UsageReport:
            return read_usage(client, seconds)

    rec = Recommender(ctl.cache, ctl.reconciler, ctl.metrics, ctl.cluster, options, usage)
    # the first report on the whole view, not on nodes without their pods
    ctl.background.append(ctl.after_scored(lambda: rec.run(interval)))
    return rec


def attach_from_config(ctl: Any, section: Any) -> Recommender:
    """`attach` with the `recommend` settings of the configuration
    (`pyctl.app.config.RecommendSection`)."""
    return attach(
        ctl,
        section.interval,
        options=Options(headroom=section.headroom),
        prometheus_url=section.prometheus_url,
        window=section.window,
    )
