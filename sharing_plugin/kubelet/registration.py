"""Registering a device plugin endpoint with kubelet (`Registration.Register` on kubelet.sock).

Kubelet dials the plugin back synchronously inside Register (with a 10 s deadline) and asks for
its options, so the caller must already be serving on `endpoint`; our deadline is longer than
kubelet's so that its own, more precise, error message is the one we report.
"""

from __future__ import annotations

import os
from pathlib import Path

import grpc

from sharing_plugin.errors import KubeletError
from sharing_plugin.kubelet.api.constants import DEVICE_PLUGINS_DIR, KUBELET_SOCKET, VERSION
from sharing_plugin.kubelet.api.deviceplugin.v1beta1 import api_pb2 as dp
from sharing_plugin.kubelet.api.deviceplugin.v1beta1 import api_pb2_grpc as dp_grpc

REGISTER_TIMEOUT_S = 15.0

KubeletSocketId = tuple[int, int, int]
"""Which `kubelet.sock` file: device, inode and change time. A restarted kubelet listens on a
new file, so a registration made through an earlier one did not reach it."""


def registration_socket(kubelet_dir: Path) -> Path:
    return Path(kubelet_dir) / DEVICE_PLUGINS_DIR / KUBELET_SOCKET


def kubelet_socket_id(kubelet_dir: Path) -> KubeletSocketId | None:
    """The `kubelet.sock` there now; None when there is none."""
    try:
        found = os.stat(registration_socket(kubelet_dir))
    except OSError:
        return None
    return (found.st_dev, found.st_ino, found.st_ctime_ns)


async def register(
    kubelet_dir: Path,
    *,
    endpoint: str,
    resource_name: str,
    options: dp.DevicePluginOptions,
    timeout: float = REGISTER_TIMEOUT_S,  # noqa: ASYNC109 -- a gRPC deadline, not a wait
) -> KubeletSocketId:
    """Register `resource_name` served on `<kubelet_dir>/device-plugins/<endpoint>`; the
    `kubelet.sock` it went through, as found before dialling (one replaced in between makes the
    registration look older than it is, never newer).

    Raises KubeletError with kubelet's own message when it refuses, or saying what to check
    when its socket is missing or does not answer.
    """
    socket = registration_socket(kubelet_dir)
    dialled = kubelet_socket_id(kubelet_dir)
    if dialled is None:
        raise KubeletError(
            f"cannot register {resource_name}: kubelet's registration socket {socket} does not "
            "exist; is kubelet running, and is --kubelet-dir its root directory?"
        )
    request = dp.RegisterRequest(
        version=VERSION, endpoint=endpoint, resource_name=resource_name, options=options
    )
    async with grpc.aio.insecure_channel(
        f"unix://{socket}", options=[("grpc.default_authority", "localhost")]
    ) as channel:
        try:
            await dp_grpc.RegistrationStub(channel).Register(request, timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            if exc.code() is grpc.StatusCode.UNAVAILABLE:
                raise KubeletError(
                    f"cannot register {resource_name}: kubelet does not answer on {socket} "
                    f"({exc.details()}); it may be restarting"
                ) from exc
            raise KubeletError(
                f"kubelet refused to register {resource_name} (endpoint {endpoint}): "
                f"{exc.details()}"
            ) from exc
    return dialled
