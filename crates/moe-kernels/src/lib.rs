//! Int4×int8 (W4A8) and int8×int8 (W8A8) expert GEMMs with runtime ISA dispatch, the fused expert pipeline and the Marlin repack. Empty for now: built under issue 4.
