"""The serving commands: one room each above the node pipeline they share.

`node/` turns config, GPUs and health into `Applied`/`Rejected` values and reports them; `run/`
serves them to the kubelet as device plugin resources, `run_dra/` as a DRA kubelet plugin,
`mps_control/` as MPS control daemons. An import contract keeps the rooms apart.
"""
