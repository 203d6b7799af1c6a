"""What the sm90 forward kernel can tile, in plain Python (no DSL import): the planner and the
kernel's ``can_implement`` share these rules."""

SUPPORTED_HEAD_DIMS = (64, 96, 128, 192, 256)
ELEM_BYTES = 2  # fp16 / bf16
WARPGROUP_ROWS = 64  # one WGMMA atom covers 64 rows; each consumer warpgroup owns 64 query rows
MAX_CONSUMER_WARPGROUPS = 3
# Registers per thread after setmaxnreg, by consumer warpgroups: (consumer, producer). The
# producer warpgroup only issues TMA, so it gives its registers to the consumers; 64K registers
# per SM bound 128 * (producer + n * consumer).
REGISTER_SPLIT = {1: (256, 56), 2: (240, 24), 3: (160, 32)}
MBARRIER_BYTES = 8


def num_consumer_warpgroups(tile_m: int) -> int:
    return tile_m // WARPGROUP_ROWS


def num_threads(tile_m: int) -> int:
    """One producer warpgroup plus one consumer warpgroup per 64 query rows."""
    return 128 * (1 + num_consumer_warpgroups(tile_m))


def smem_bytes(
    head_dim: int, tile_m: int, tile_n: int, num_stages: int, separate_o: bool,
    head_dim_v: int | None = None, q_stages: int = 1,
) -> int:
    """``q_stages`` Q tiles, num_stages K and V tiles, an O tile unless it reuses Q's buffer,
    barriers; V and O have ``head_dim_v`` columns (default head_dim, at most head_dim)."""
    head_dim_v = head_dim_v or head_dim
    q = q_stages * tile_m * head_dim * ELEM_BYTES
    o = tile_m * head_dim_v * ELEM_BYTES if separate_o else 0
    kv = num_stages * tile_n * (head_dim + head_dim_v) * ELEM_BYTES
    barriers = (2 * q_stages + 4 * num_stages) * MBARRIER_BYTES
    return q + o + kv + barriers + 1024  # + alignment slack


def can_implement(
    head_dim: int,
    tile_m: int,
    tile_n: int,
    num_stages: int,
    separate_o: bool,
    smem_capacity: int,
    head_dim_v: int | None = None,
) -> bool:
    consumers = num_consumer_warpgroups(tile_m)
    return (
        head_dim in SUPPORTED_HEAD_DIMS
        # O (dim_v columns) reuses Q's buffer; one WGMMA covers N = dim_v.
        and (head_dim_v is None or (head_dim_v <= head_dim and head_dim_v % 64 == 0))
        and tile_m % WARPGROUP_ROWS == 0
        and 1 <= consumers <= MAX_CONSUMER_WARPGROUPS
        # WGMMA N is a multiple of 8 up to 256; P (tile_m x tile_n) feeds PV in k16 slices.
        and tile_n % 16 == 0
        and 16 <= tile_n <= 256
        and num_stages >= 1
        and smem_bytes(head_dim, tile_m, tile_n, num_stages, separate_o, head_dim_v)
        <= smem_capacity
    )


def o_in_v_fits(tile_m: int, tile_n: int, num_stages: int) -> bool:
    """Whether O (tile_m x dim_v) fits in the V stages (num_stages x tile_n x dim_v): where O
    has no buffer of its own, a persistent kernel then puts it there rather than in Q's, so
    that the next tile's Q loads as soon as the last S is computed."""
    return num_stages * tile_n >= tile_m


def separate_o_fits(
    head_dim: int, tile_m: int, tile_n: int, num_stages: int, smem_capacity: int,
    head_dim_v: int | None = None,
) -> bool:
    """Whether a persistent kernel's O gets a buffer of its own (the next tile's Q then loads
    during this tile's epilogue); else O takes V's stages (``o_in_v_fits``) or Q's buffer."""
    return smem_bytes(head_dim, tile_m, tile_n, num_stages, True, head_dim_v) <= smem_capacity


def separate_o_q_stages(
    head_dim: int, tile_m: int, tile_n: int, num_stages: int, smem_capacity: int,
    head_dim_v: int | None = None,
) -> int:
    """Q stages of a persistent kernel whose O has a buffer of its own (``separate_o_fits``):
    two where a second Q tile fits too, so that the next work tile's Q loads while this one
    still reads its own (the consumers then find it in place at the tile's start; with one
    stage it could load only once both consumer warpgroups were past their last S), else one.
    The planner's tiles: d64, d96, d128 get two (d128 128 x 128, two K / V stages: 224 KB of
    Q, K, V and O)."""
    two = smem_bytes(
        head_dim, tile_m, tile_n, num_stages, True, head_dim_v, q_stages=2
    ) <= smem_capacity
    return 2 if two else 1
