"""Views of a finished plan, in the forms other systems read (pure).

Each takes the values planning produced (config, node, plan) and returns documents: the node
labels gpu-feature-discovery would publish and the NFD feature file that carries them, the
devices, ResourceSlices and DeviceClasses of Dynamic Resource Allocation, and the CDI spec of a
prepared claim. They sit above planning and below the adapters, so the adapters that publish
them and the `plan` command print one computation, and planning itself never depends on how
its result is shown.
"""
