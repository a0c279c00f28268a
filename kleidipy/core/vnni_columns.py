"""Per-column sums of accumulators over KleidiAI's NEON RHS layouts (groups of 4 columns) in AVX-512 IR: a
64-byte load of such a group holds 4 bytes of each of its 4 columns in 4 lanes (kr 4: column c in lanes 4t + c;
kr 8: lanes 2c, 2c + 1, 8 + 2c, 9 + 2c), so a dot product accumulated per load is summed per column afterwards.
Used by the Q8_0, Q4_1 and int4 per-channel families' VNNI tiles (hand-written IR: numba emits no lane shuffles
of this shape)."""

from __future__ import annotations

from kleidipy.core.vnni import pick

#: sum_columns's two rounds per kr: the lanes (of x ‖ y, 32 lanes) of the two addends of each combine of two
#: vectors x, y; the lists taking lane j from x[j] or y[j] compile to a blend, the others to one lane shuffle.
COLUMN_FOLDS = {
    # kr = 4: 128-bit lane t of a group's vector holds its 4 columns (column c in lane 4t + c). Round 1 adds
    # 128-bit lanes t and t + 2, x's into 128-bit lanes 0, 1 and y's into 2, 3; round 2 adds 128-bit lanes 0 and
    # 1 of x into lane 0, of y into 1, and lanes 2 and 3 of x into 2, of y into 3: fed g0, g2 (x) and g1, g3 (y),
    # it gives g0 ‖ g1 ‖ g2 ‖ g3.
    4: (
        ([j if j < 8 else 16 + j for j in range(16)], [8 + j for j in range(16)]),
        (
            [j if (j // 4) % 2 == 0 else 16 + j for j in range(16)],
            [[4, 16, 12, 24][j // 4] + j % 4 for j in range(16)],
        ),
    ),
    # kr = 8: lanes 2c, 2c + 1, 8 + 2c and 9 + 2c hold column c. Round 1 adds lanes 2j and 2j + 1 of x into lane
    # 2j, of y into lane 2j + 1; round 2 adds the two 256-bit halves into lane 4g + c (g0, g1 from x; g2, g3 from y).
    8: (
        ([j if j % 2 == 0 else 16 + j for j in range(16)], [j + 1 if j % 2 == 0 else 16 + j - 1 for j in range(16)]),
        (
            [16 * (g // 2) + 2 * c + g % 2 for g in range(4) for c in range(4)],
            [16 * (g // 2) + 8 + 2 * c + g % 2 for g in range(4) for c in range(4)],
        ),
    ),
}


def sum_columns(builder, accs: list, kr: int):
    """i32x16 whose lane 4g + c is the sum of the 4 lanes of accs[g] (4 accumulators of NEON groups of 4 columns,
    each 64-byte load holding 4 bytes of every column in 4 lanes as a NEON RHS of kr 4 or 8 lays them out) that
    hold column c: two rounds of adds of lane-shuffled pairs (COLUMN_FOLDS)."""
    first, second = COLUMN_FOLDS[kr]
    order = (accs[0], accs[2], accs[1], accs[3]) if kr == 4 else tuple(accs)

    def fold(x, y, lanes):
        return builder.add(pick(builder, x, y, lanes[0]), pick(builder, x, y, lanes[1]))

    return fold(fold(order[0], order[1], first), fold(order[2], order[3], first), second)
