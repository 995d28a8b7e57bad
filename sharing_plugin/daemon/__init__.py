"""Orchestration: the supervisor that turns plans into running resource servers."""
