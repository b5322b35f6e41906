"""Every equivalence the optimizer knows, as plain ordered tuples of pure functions.

A rule ``rule(node) -> Iterator[PNode]`` looks at the top node of an IA plan only and
yields equivalent nodes (possibly none).  The search applies them at every position.
"""

from .domain import DOMAIN_RULES, affinity_mm, bmm, classify, cmm, cmm_tree, is_pure_rekey, match_contraction, place_free_source, rmm, rmm_grid, site_grids
from .kernel import (RULES_R1, r1_1_merge_filters, r1_2_merge_maps, r1_3_swap_map_and_filter,
                     r1_4_map_through_aggregate, r1_5_push_filter_into_aggregate, r1_6_push_filter_into_join,
                     r1_7_merge_map_into_join)
from .repartition import (RULES_R2, drop_noop_move, r2_1_last_move_wins, r2_2_swap_move_and_filter, r2_3_swap_move_and_map,
                          r2_4_drop_shuffle_before_aggregate, r2_5_pre_aggregate, r2_6_join_strategies,
                          r2_7_drop_shuffle_after_join)

RULES = RULES_R1 + RULES_R2 + DOMAIN_RULES

__all__ = [
    "RULES", "RULES_R1", "RULES_R2", "DOMAIN_RULES", "match_contraction", "classify", "place_free_source", "affinity_mm", "bmm", "cmm", "cmm_tree", "is_pure_rekey", "rmm", "rmm_grid", "site_grids",
    "r1_1_merge_filters", "r1_2_merge_maps", "r1_3_swap_map_and_filter", "r1_4_map_through_aggregate",
    "r1_5_push_filter_into_aggregate", "r1_6_push_filter_into_join", "r1_7_merge_map_into_join",
    "r2_1_last_move_wins", "r2_2_swap_move_and_filter", "r2_3_swap_move_and_map",
    "r2_4_drop_shuffle_before_aggregate", "r2_5_pre_aggregate", "r2_6_join_strategies",
    "r2_7_drop_shuffle_after_join", "drop_noop_move",
]
