"""eagle-mdsd: tree-based speculative decoding with EAGLE heads and provably lossless multi-draft verification."""
