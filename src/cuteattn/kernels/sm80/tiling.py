"""What the sm80 forward kernel can tile, in plain Python (no DSL import): the planner and the
kernel's ``can_implement`` share these rules."""

SUPPORTED_HEAD_DIMS = (64, 96, 128, 192, 256)
ELEM_BYTES = 2  # fp16 / bf16
COPY_ELEMS = 8  # one 16-byte cp.async / store per thread per access


def smem_bytes(head_dim: int, tile_m: int, tile_n: int, head_dim_v: int | None = None) -> int:
    """Q tile + one K tile + one V tile (O reuses the Q buffer; V and O have ``head_dim_v``
    columns, default head_dim)."""
    head_dim_v = head_dim_v or head_dim
    return (tile_m * head_dim + tile_n * (head_dim + head_dim_v)) * ELEM_BYTES


def same_row_copies(head_dim: int, head_dim_v: int | None) -> bool:
    """Whether tiles of head_dim and head_dim_v columns share one copy layout (their
    swizzle-atom rows are equally wide) and V's / O's tiles fit Q's buffer (O reuses it)."""
    if head_dim_v is None:
        return True
    return head_dim_v <= head_dim and (head_dim % 64 == 0) == (head_dim_v % 64 == 0) and (
        head_dim_v % 32 == 0
    )


def rows_per_copy_pass(head_dim: int, num_threads: int) -> int:
    """Rows one gmem<->smem copy pass covers: a swizzle-atom row is 64 (or 32) elements wide."""
    atom_cols = 64 if head_dim % 64 == 0 else 32
    return num_threads // (atom_cols // COPY_ELEMS)


def can_implement(
    head_dim: int, tile_m: int, tile_n: int, num_threads: int, smem_capacity: int,
    head_dim_v: int | None = None,
) -> bool:
    num_warps = num_threads // 32
    rows_per_pass = rows_per_copy_pass(head_dim, num_threads)
    return (
        head_dim in SUPPORTED_HEAD_DIMS
        and same_row_copies(head_dim, head_dim_v)
        and num_threads % 32 == 0
        and num_warps >= 1
        # Warps stack along M, 16 rows each per MMA; P feeds PV in k16 slices of the key tile.
        and tile_m % (16 * num_warps) == 0
        and tile_n % 16 == 0
        # Copies move whole passes, so every tile is a whole number of them.
        and tile_m % rows_per_pass == 0
        and tile_n % rows_per_pass == 0
        and smem_bytes(head_dim, tile_m, tile_n, head_dim_v) <= smem_capacity
    )


# ---- Backward ------------------------------------------------------------------------------------
# Warps per GEMM, (along M, along N), by warp count: S = Q K^T / dP = dO V^T (tile_m x tile_n),
# dK / dV (tile_n x dim), dQ (tile_m x dim). Each warp takes 16 x 16 of its GEMM's output per step.
BACKWARD_WARP_LAYOUTS = {
    8: ((2, 4), (4, 2), (4, 2)),
    4: ((2, 2), (2, 2), (2, 2)),
}


def backward_warp_layouts(num_warps: int, head_dim: int):
    """(S / dP, dK / dV, dQ) warp grids. With 8 warps, dQ (tile_m x head_dim) puts 4 warps
    along head_dim where each then gets whole 16-column pairs of 8-column MMA atoms (head
    dims 128, 192, 256): FlashAttention-2's grid, fewer ldmatrix of K^T per step than 4
    warps along the 64 queries. d64's 128-row tiles keep (4, 2), FlashAttention-2's d64 grid:
    32 x 32 per warp reads 64 x 128 of dS and K per step where 64 x 16 reads 80 x 128. From
    head dim 192 (64 x 64 tiles) dK / dV take 4 warps along the head dim too (32 x 64 per warp
    instead of 16 x 128: 168 ldmatrix per warp and step instead of 204 at d256), and S / dP 4
    warps along the queries: FlashAttention-2's d256 grids; with S / dP's (2, 4) kept, d256
    spills 44 bytes (sm_80 SASS)."""
    sdp, dkv, dq = BACKWARD_WARP_LAYOUTS[num_warps]
    if num_warps == 8 and head_dim % 64 == 0 and head_dim >= 128:
        dq = (2, 4)
        if head_dim >= 192:
            sdp, dkv = (4, 2), (2, 4)
    return sdp, dkv, dq


def backward_smem_bytes(
    head_dim: int, tile_m: int, tile_n: int, num_stages: int = 1, head_dim_v: int | None = None
) -> int:
    """Q and dO tiles (num_stages each), K and V tiles, P and dS (tile_m x tile_n each), and
    each stage's fp32 lse and dpsum; dO and V have ``head_dim_v`` columns (default head_dim).
    The kernel's struct is a whole number of its 1024-byte alignment."""
    head_dim_v = head_dim_v or head_dim
    query = num_stages * tile_m * (head_dim + head_dim_v)
    keys = tile_n * (head_dim + head_dim_v)
    rows_fp32 = 2 * num_stages * tile_m * 4
    total = (query + keys + 2 * tile_m * tile_n) * ELEM_BYTES + rows_fp32
    return -(-total // 1024) * 1024


def can_implement_backward(
    head_dim: int, tile_m: int, tile_n: int, num_threads: int, smem_capacity: int,
    num_stages: int = 1, head_dim_v: int | None = None,
) -> bool:
    num_warps = num_threads // 32
    if num_threads % 32 or num_warps not in BACKWARD_WARP_LAYOUTS:
        return False
    sdp, dkv, dq = backward_warp_layouts(num_warps, head_dim)
    rows_per_pass = rows_per_copy_pass(head_dim, num_threads)
    return (
        head_dim in SUPPORTED_HEAD_DIMS
        and same_row_copies(head_dim, head_dim_v)
        and (head_dim_v or head_dim) % (16 * dkv[1]) == 0
        and tile_m % (16 * sdp[0]) == 0
        and tile_n % (16 * sdp[1]) == 0
        and tile_n % (16 * dkv[0]) == 0
        and head_dim % (16 * dkv[1]) == 0
        and tile_m % (16 * dq[0]) == 0
        and head_dim % (16 * dq[1]) == 0
        # P and dS tiles use a swizzle atom 32 or 64 keys wide.
        and tile_n % 32 == 0
        and tile_m % rows_per_pass == 0
        and tile_n % rows_per_pass == 0
        # lse and dpsum: 16 bytes per thread of the first tile_m / 2.
        and tile_m % 4 == 0
        and num_threads >= tile_m // 2
        and num_stages in (1, 2)
        and backward_smem_bytes(head_dim, tile_m, tile_n, num_stages, head_dim_v)
        <= smem_capacity
    )
