"""The MPS control daemon adapter: the control binary, its daemons' processes, the state file.

`ControlBinary` runs `nvidia-cuda-mps-control` (the `MpsControl` Protocol lists exactly what is
asked of it); `wait_exit` learns of a daemon's death from the kernel (a pidfd), without
polling; `DaemonRecord` is the state file the `mps-control` side writes beside each resource's
pipe directory and the plugin side reads, through `watch_record`, to advertise an MPS resource
as Healthy only while its daemon answers.
"""

from sharing_plugin.mps.control import ControlBinary, MpsControl
from sharing_plugin.mps.process import process_alive, wait_exit
from sharing_plugin.mps.record import (
    RECORD_FILE,
    DaemonRecord,
    DaemonState,
    read_record,
    remove_record,
    write_record,
)
from sharing_plugin.mps.watch import RecordView, current_view, watch_record

__all__ = [
    "RECORD_FILE",
    "ControlBinary",
    "DaemonRecord",
    "DaemonState",
    "MpsControl",
    "RecordView",
    "current_view",
    "process_alive",
    "read_record",
    "remove_record",
    "wait_exit",
    "watch_record",
    "write_record",
]
