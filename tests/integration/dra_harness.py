"""Run the DRA daemon in-process against the fake kube-apiserver and the DRA kubelet simulator."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightkube
from kube_api import FakeKubeApi, Permissions
from support.dra.allocator import allocate, allocated_devices, consumed_capacity
from support.dra.kubelet import DraKubeletSimulator, PreparedAnswer
from support.observe import recording_backend, wait_published

from sharing_plugin.daemon.node.options import SourceOptions
from sharing_plugin.daemon.run_dra.driver import DraDriver, DraOptions
from sharing_plugin.daemon.run_dra.pool import PoolWriter
from sharing_plugin.dra.claims import ClaimRef
from sharing_plugin.views.dra_api import PublishedDevice, device_class, device_class_name

DRIVER = "gpu.sharing-plugin.io"
NODE = "node-a"


@dataclass
class DraRun:
    api: FakeKubeApi
    kubelet: DraKubeletSimulator
    daemon: DraDriver
    config: Path
    root: Path
    nvml: Any

    @property
    def keeper(self) -> PoolWriter:
        """The daemon's pool keeper (`support.observe.wait_published` waits for its publishes)."""
        assert self.daemon.keeper is not None
        return self.daemon.keeper

    @property
    def version(self) -> str:
        return self.api.dra_versions[0]

    def slices(self) -> list[dict[str, Any]]:
        return [s for s in self.api.dra_objects("resourceslices") if s["spec"]["driver"] == DRIVER]

    def devices(self) -> list[dict[str, Any]]:
        """The devices of the node's slices, as the API server stored them."""
        return [d for s in self.slices() for d in s["spec"].get("devices") or ()]

    def device_names(self) -> list[str]:
        return [d["name"] for s in self.slices() for d in s["spec"]["devices"]]

    def write(self, text: str) -> None:
        tmp = self.config.with_name(self.config.name + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(self.config)

    async def published(self, count: int, timeout: float = 5.0) -> tuple[PublishedDevice, ...]:  # noqa: ASYNC109
        """Once the pool holds `count` devices."""
        return await wait_published(self.keeper, lambda d: len(d) == count, timeout)

    def add_class(self, resource: str) -> str:
        document = device_class(resource, DRIVER, api_version=f"resource.k8s.io/{self.version}")
        self.api.put_dra_object(document)
        return device_class_name(resource, DRIVER)

    def claim(
        self,
        name: str,
        resource: str,
        *,
        count: int = 1,
        selectors: list[str] | None = None,
        namespace: str = "default",
        memory: str | None = None,
    ) -> ClaimRef:
        """A ResourceClaim for `count` devices of `resource` (asking `memory` of each where
        given), allocated by the test allocator from the slices in the API (the scheduler's
        job in a cluster)."""
        wanted: dict[str, Any] = {"deviceClassName": self.add_class(resource), "count": count}
        if selectors:
            wanted["selectors"] = [{"cel": {"expression": e}} for e in selectors]
        if memory is not None:
            wanted["capacity"] = {"requests": {"memory": memory}}
        request = (
            {"name": "gpu", "exactly": wanted}
            if self.version == "v1"
            else {"name": "gpu", **wanted}
        )
        document: dict[str, Any] = {
            "apiVersion": f"resource.k8s.io/{self.version}",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"devices": {"requests": [request]}},
        }
        claims = self.api.dra_objects("resourceclaims")
        document["status"] = {
            "allocation": allocate(
                document,
                slices=self.api.dra_objects("resourceslices"),
                classes=self.api.dra_objects("deviceclasses"),
                allocated=allocated_devices(claims),
                consumed=consumed_capacity(claims),
            )
        }
        stored = self.api.put_dra_object(document)
        return ClaimRef(namespace, name, stored["metadata"]["uid"])

    async def prepare(self, ref: ClaimRef) -> PreparedAnswer:
        return (await self.kubelet.prepare(DRIVER, [ref]))[ref.uid]

    async def unprepare(self, ref: ClaimRef) -> str:
        return (await self.kubelet.unprepare(DRIVER, [ref]))[ref.uid]


def foreign_claim(api: FakeKubeApi, name: str, device: str, *, pool: str) -> ClaimRef:
    """A claim allocated a device of another node's pool, stored as the scheduler would."""
    version = api.dra_versions[0]
    stored = api.put_dra_object(
        {
            "apiVersion": f"resource.k8s.io/{version}",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "default", "uid": str(uuid.uuid4())},
            "spec": {"devices": {"requests": []}},
            "status": {
                "allocation": {
                    "devices": {
                        "results": [
                            {"request": "gpu", "driver": DRIVER, "pool": pool, "device": device}
                        ]
                    }
                }
            },
        }
    )
    return ClaimRef("default", name, stored["metadata"]["uid"])


@asynccontextmanager
async def dra_running(
    root: Path,
    config_text: str,
    *,
    gpus: str = "simulated:dgx-a100-80gb",
    versions: tuple[str, ...] = ("v1", "v1beta1"),
    kubelet_services: tuple[str, ...] | None = None,
    api: FakeKubeApi | None = None,
    wait_registered: bool = True,
    kubelet_wipes: bool = True,
    permissions: Permissions | None = None,
    nvml: Any = None,
    **options: Any,
) -> AsyncIterator[DraRun]:
    """The fake API (serving `versions`), a DRA kubelet simulator and the DRA daemon.

    With `permissions`, the daemon's credentials may do only that (the fake's RBAC); with
    `nvml`, the daemon uses that NVML (a simulated node kept from an earlier run: a restart
    finds the MIG instances the GPUs kept)."""
    config = root / "config.yaml"
    config.write_text(config_text, encoding="utf-8")
    nvml = nvml if nvml is not None else recording_backend(gpus)
    async with _api(api, permissions) as server:
        server.dra_versions = versions
        server.put_node(NODE)
        path = server.kubeconfig(root / "kubeconfig", token="t" if permissions else None)
        client = lightkube.AsyncClient(config=lightkube.KubeConfig.from_file(path))

        async def wipe(driver: str) -> None:  # the kubelet deletes a deregistered driver's slices
            for s in server.dra_objects("resourceslices"):
                if s["spec"]["driver"] == driver and s["spec"].get("nodeName") == NODE:
                    server.delete_dra_object("resourceslices", s["metadata"]["name"])

        opts = DraOptions(
            source=SourceOptions(config_path=config, gpus=gpus, kubelet_dir=root, node_name=NODE),
            driver_name=DRIVER,
            cdi_dir=root / "cdi",
            publish_backoff_s=(0.05, 0.5),
            **options,
        )
        sim_options: dict[str, Any] = {"dial_timeout": 2.0}
        if kubelet_wipes:
            sim_options["on_deregistered"] = wipe
        if kubelet_services is not None:
            sim_options["services"] = kubelet_services
        try:
            async with DraKubeletSimulator(root, **sim_options) as kubelet:
                async with DraDriver(opts, nvml=nvml, kube_client=client) as daemon:
                    run = DraRun(server, kubelet, daemon, config, root, nvml)
                    if wait_registered:
                        await kubelet.wait_plugin(DRIVER)
                        await wait_published(run.keeper, lambda d: True)
                    yield run
                if DRIVER in kubelet.plugins:  # the kubelet notices the plugin going away
                    await kubelet.wait_gone(DRIVER)
        finally:
            await client.close()


@asynccontextmanager
async def _api(
    api: FakeKubeApi | None, permissions: Permissions | None
) -> AsyncIterator[FakeKubeApi]:
    if api is not None:
        yield api
        return
    tokens = {"t": permissions} if permissions is not None else None
    async with FakeKubeApi(tokens=tokens) as server:
        yield server
