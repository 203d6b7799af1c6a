"""Turn counters for the deterministic backward: the key tiles that add to one query tile's
dq do so in key-tile order.

One int32 counter per (batch, query head, query tile), zeroed before the launch. The key tiles
that visit a query tile are always 0 .. N (causal or not, a query tile seen by key tile n is
seen by every key tile before it), so key tile n waits until the counter holds n, adds, and
stores n + 1. Waiting never deadlocks: the CTAs of lower key tiles of the same head and batch
were dispatched first (key tiles are the fastest grid dimension).
"""

import cutlass.cute as cute
from cutlass import Int32


@cute.jit
def wait_for_turn(counter: cute.Pointer, turn: Int32):
    """Poll ``counter`` until it holds ``turn`` (acquire: the previous holder's additions are
    visible after it). Called by one thread; the caller holds the others back."""
    seen = cute.arch.load(counter, Int32, sem="acquire", scope="gpu")
    while seen != turn:
        seen = cute.arch.load(counter, Int32, sem="acquire", scope="gpu")


@cute.jit
def pass_turn(counter: cute.Pointer, turn: Int32):
    """Hand the query tile to key tile ``turn + 1`` (release: this thread's additions, and those
    it has synchronised with, are visible first). Called by one thread."""
    cute.arch.store(counter, turn + 1, sem="release", scope="gpu")
