"""Advantage estimators (credit assignment; spec: credit_assignment.md)."""

from rlax_post.advantages._group import GROUP_METHODS
from rlax_post.advantages._group import STD_KINDS
from rlax_post.advantages._group import group_advantages
from rlax_post.advantages._group import group_stats

__all__ = (
    'GROUP_METHODS',
    'STD_KINDS',
    'group_advantages',
    'group_stats',
)
