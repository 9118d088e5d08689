"""A model of the flash kernels' CTA order and L2 (tile_order.h), as step 44 of
docs/log/flash-attention.md used it to predict the DRAM traffic of CTA groups before measuring them.

CTAs start in block order on `slots` places (one per SM at d 128), each walking its inner tiles at
one tile per time step (causal: key block r of the backward walks query tiles 2r..; query block r of
the forward, heaviest first, walks key tiles 0..). Every tile step touches its operands in an LRU
cache of `cap` bytes (Q, dO and the fp32 dq accumulator in the backward, K and V in the forward);
misses are DRAM reads, evicted dq tiles DRAM writes. Prints the makespan (time steps) and the DRAM
megabytes per group size.

  python3 tools/cta_order_l2_model.py --seq 16384 --d 128 --batch 8
"""
import argparse
import collections


def block_order(seqs, tiles, group):
    """(sequence, rank) of each block, as TileOrder::at lays them out (short group first)."""
    lead, out = seqs % group, []
    for rank in range(tiles):
        out += [(s, rank) for s in range(lead)]
    for g0 in range(lead, seqs, group):
        for rank in range(tiles):
            out += [(s, rank) for s in range(g0, g0 + group)]
    return out


def simulate(kind, seqs, seq, d, group, slots, cap):
    if kind == "backward":
        tiles = seq // 128
        walk = lambda r: range(2 * r, seq // 64)
        operands = lambda s, i: [((s, "q", i), 64 * d * 2), ((s, "do", i), 64 * d * 2), ((s, "dq", i), 64 * d * 4)]
    else:
        tiles = seq // 128
        walk = lambda r: range(tiles - r)
        operands = lambda s, i: [((s, "k", i), 128 * d * 2), ((s, "v", i), 128 * d * 2)]
    cache, used, read, written = collections.OrderedDict(), 0, 0, 0
    order, nxt, running, steps = block_order(seqs, tiles, group), 0, [], 0
    while nxt < len(order) or running:
        while len(running) < slots and nxt < len(order):
            s, r = order[nxt]
            nxt += 1
            running.append([s, list(walk(r)), 0])
        still = []
        for cta in running:
            s, inner, at = cta
            for key, size in operands(s, inner[at]):
                if key in cache:
                    cache.move_to_end(key)
                    continue
                read += size
                cache[key] = size
                used += size
                while used > cap:
                    old, old_size = cache.popitem(last=False)
                    used -= old_size
                    written += old_size if old[1] == "dq" else 0
            cta[2] += 1
            if cta[2] < len(inner):
                still.append(cta)
        running, steps = still, steps + 1
    return steps, read / 1e6, written / 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=16384)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--slots", type=int, default=132, help="CTAs running at once")
    ap.add_argument("--l2-mib", type=int, default=40)
    a = ap.parse_args()
    for kind in ("backward", "forward"):
        for group in (1, 2, 3, 4, 8):
            if group > a.batch:
                continue
            steps, read, written = simulate(kind, a.batch, a.seq, a.d, group, a.slots, a.l2_mib << 20)
            print(f"{kind:8} group {group}: makespan {steps} tile steps, DRAM read {read:.0f} MB, written {written:.0f} MB")


if __name__ == "__main__":
    main()
