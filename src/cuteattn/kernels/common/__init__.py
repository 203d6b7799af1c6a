"""Building blocks shared by every kernel family: fragment views, masks, online softmax, seqlen
and block info, tile schedulers, the forward epilogue, and the fake tensors compile checks use."""
