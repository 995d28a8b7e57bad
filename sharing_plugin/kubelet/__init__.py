"""Kubelet adapters: device plugin servers, registration, PodResources, and a simulator."""
