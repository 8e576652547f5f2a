"""Old path of serving/launch.py, kept for cluster/up.py."""

from switchyard.engine.serving.launch import die_with_parent_term

__all__ = ["die_with_parent_term"]
