"""`eagle-mdsd pairs`: the drafting schemes, the verifiers and the lossless pairs of them."""

from __future__ import annotations

from .. import drafting, verification


def add_parser(sub) -> None:
    sub.add_parser("pairs", help="list drafting schemes, verifiers and the lossless pairs").set_defaults(fn=run)


def run(args) -> None:
    print("drafting schemes:")
    for scheme in drafting.SCHEMES.values():
        print(f"  {scheme.name:20s} {scheme.reference}")
    print("verifiers:")
    for verifier in verification.VERIFIERS.values():
        print(f"  {verifier.name:20s} {verifier.reference}")
    print("compatible (scheme, verifier) pairs:")
    for scheme, verifier in verification.pairs():
        print(f"  {scheme} + {verifier}")
