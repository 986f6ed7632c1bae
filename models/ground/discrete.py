"""Exact discrete Gaussian sampling from random *integers* (Canonne, Kamath & Steinke, NeurIPS 2020).

Floating-point Gaussian samplers leak through their low-order bits (Mironov 2012): which doubles a
sampler can output depends on the value. The discrete Gaussian ``N_Z(0, sigma^2)`` — ``P[x] ∝
exp(-x^2 / (2 sigma^2))`` on the integers — sampled with integer and rational arithmetic only has no
such artefact. The algorithms are CKS's: Bernoulli(exp(-gamma)) by a sequence of rational Bernoullis
(Alg. 1), the discrete Laplace by rejection (Alg. 2), the discrete Gaussian by rejection from the
discrete Laplace with scale ``t = floor(sigma) + 1`` (Alg. 3). Randomness: uniform integers from a
numpy ``Generator`` (``integers`` draws by rejection on random bits: exact), so the keyed Philox
source of :mod:`models.ground.noise` drives it and the noise stays a pure function of the secret seed
and the address.

>>> import numpy as np
>>> from fractions import Fraction
>>> g = np.random.Generator(np.random.Philox(key=7))
>>> xs = [discrete_gaussian(Fraction(4), g) for _ in range(2000)]
>>> all(isinstance(x, int) for x in xs), abs(sum(xs) / len(xs)) < 0.3
(True, True)
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

__all__ = ["randbelow", "bernoulli", "bernoulli_exp", "discrete_laplace", "discrete_gaussian", "discrete_gaussian_pmf",
           "RandomWords", "discrete_gaussian_variance"]


def randbelow(n: int, rng: np.random.Generator) -> int:
    """A uniform integer in ``[0, n)`` of any size (:meth:`RandomWords.below` on ``rng``'s words)."""
    return RandomWords(rng).below(n)


def bernoulli(p: Fraction, rng: np.random.Generator) -> bool:
    """``True`` with probability ``p`` (a rational in [0, 1]) (:meth:`RandomWords.bernoulli`)."""
    if not 0 <= p <= 1:
        raise ValueError(f"`p` must be in [0, 1], got {p}.")
    return RandomWords(rng).bernoulli(p.numerator, p.denominator)


def bernoulli_exp(gamma: Fraction, rng: np.random.Generator) -> bool:
    """``True`` with probability ``exp(-gamma)``, ``gamma >= 0`` rational (CKS Alg. 1; :meth:`RandomWords.bernoulli_exp`)."""
    if gamma < 0:
        raise ValueError(f"`gamma` must be non-negative, got {gamma}.")
    return RandomWords(rng).bernoulli_exp(gamma.numerator, gamma.denominator)


def discrete_laplace(t: int, rng: np.random.Generator) -> int:
    """``P[x] ∝ exp(-|x| / t)`` on the integers, ``t >= 1`` (CKS Alg. 2; :meth:`RandomWords.discrete_laplace`)."""
    return RandomWords(rng).discrete_laplace(t)


def discrete_gaussian(sigma2: Fraction, rng: np.random.Generator) -> int:
    """``P[x] ∝ exp(-x^2 / (2 sigma2))`` on the integers, ``sigma2 > 0`` rational (CKS Alg. 3;
    :meth:`RandomWords.discrete_gaussian`)."""
    if sigma2 <= 0:
        raise ValueError(f"`sigma2` must be positive, got {sigma2}.")
    return RandomWords(rng).discrete_gaussian(sigma2)


class RandomWords:
    """The same algorithms (CKS Alg. 1-3) on integers only, reading uniform 64-bit words lazily.

    The words are the raw output of the generator's bit generator (for :mod:`models.ground.noise`: the keyed
    Philox of one address), taken 64 at a time. Everything below is integer arithmetic: a Bernoulli with a
    rational probability ``num / den`` compares random words with the binary expansion of ``num / den`` digit by
    digit (one word in all but a ``2**-64`` fraction of calls, however large ``den`` is), a uniform integer is
    drawn by rejection on the top bits of a word. No float enters the sampling path.

    >>> w = RandomWords(np.random.Generator(np.random.Philox(key=7)))
    >>> xs = [w.discrete_gaussian(16) for _ in range(2000)]   # sigma^2 = 16
    >>> all(isinstance(x, int) for x in xs), abs(sum(xs) / len(xs)) < 0.5
    (True, True)
    """

    __slots__ = ("_bits", "_buf", "_pos")

    _BLOCK = 64

    def __init__(self, rng: np.random.Generator) -> None:
        self._bits = rng.bit_generator
        self._buf: list[int] = []
        self._pos = 0

    def word(self) -> int:
        """A uniform integer in ``[0, 2**64)``."""
        if self._pos >= len(self._buf):
            self._buf = self._bits.random_raw(self._BLOCK).tolist()
            self._pos = 0
        w: int = self._buf[self._pos]
        self._pos += 1
        return w

    def below(self, n: int) -> int:
        """A uniform integer in ``[0, n)`` (rejection on the top ``bitlength(n - 1)`` bits)."""
        if n < 1:
            raise ValueError(f"`n` must be positive, got {n}.")
        k = (n - 1).bit_length()
        if k == 0:
            return 0
        words = (k + 63) // 64
        shift = 64 * words - k
        while True:
            x = self.word()
            for _ in range(words - 1):
                x = (x << 64) | self.word()
            x >>= shift
            if x < n:
                return x

    def bernoulli(self, num: int, den: int) -> bool:
        """``True`` with probability ``num / den`` (``U < num / den`` for ``U`` uniform, compared lazily)."""
        if num <= 0:
            return False
        if num >= den:
            return True
        r = num
        while True:
            q, r = divmod(r << 64, den)  # the next 64 binary digits of num / den
            w = self.word()
            if w != q:
                return w < q
            if r == 0:  # num / den ends here; U >= it with probability 1
                return False

    def bernoulli_exp(self, num: int, den: int) -> bool:
        """``True`` with probability ``exp(-num / den)``, ``num / den >= 0`` (CKS Alg. 1)."""
        if num < 0 or den < 1:
            raise ValueError(f"`num / den` must be non-negative with den >= 1, got {num}/{den}.")
        while num > den:  # exp(-g) = exp(-1) * exp(-(g - 1))
            if not self.bernoulli_exp(1, 1):
                return False
            num -= den
        k = 1
        while self.bernoulli(num, den * k):
            k += 1
        return k % 2 == 1

    def discrete_laplace(self, t: int) -> int:
        """``P[x] ∝ exp(-|x| / t)`` on the integers, integer ``t >= 1`` (CKS Alg. 2)."""
        while True:
            u = self.below(t)
            if not self.bernoulli_exp(u, t):
                continue
            v = 0
            while self.bernoulli_exp(1, 1):
                v += 1
            y = u + t * v
            negative = self.word() >> 63  # one fair bit
            if negative and y == 0:
                continue
            return -y if negative else y

    def discrete_gaussian(self, sigma2: int | Fraction) -> int:
        """``P[x] ∝ exp(-x^2 / (2 sigma2))`` on the integers, ``sigma2 > 0`` rational (CKS Alg. 3)."""
        s2 = Fraction(sigma2)
        n, d = s2.numerator, s2.denominator
        if n <= 0:
            raise ValueError(f"`sigma2` must be positive, got {sigma2}.")
        t = math.isqrt(n // d) + 1  # floor(sigma) + 1
        den = 2 * n * t * t * d
        while True:
            y = self.discrete_laplace(t)
            a = abs(y) * t * d - n  # (|y| - sigma2 / t)^2 / (2 sigma2) = a^2 / (2 n t^2 d)
            if self.bernoulli_exp(a * a, den):
                return y


def discrete_gaussian_variance(sigma2: float) -> float:
    """``E[X^2]`` of ``N_Z(0, sigma2)`` (numerically, over ±(20 sigma + 10)); ``< sigma2`` (CKS Prop. 16)."""
    s = math.sqrt(sigma2)
    k = np.arange(-int(20 * s) - 10, int(20 * s) + 11).astype(float)
    p = np.exp(-(k**2) / (2 * sigma2))
    return float((k**2 * p).sum() / p.sum())


def discrete_gaussian_pmf(x: np.ndarray, sigma2: float) -> np.ndarray:
    """The pmf at integers ``x`` (normalised numerically over ±(20 sigma + 10)); for tests."""
    s = math.sqrt(sigma2)
    support = np.arange(-int(20 * s) - 10, int(20 * s) + 11)
    z = np.exp(-support.astype(float) ** 2 / (2 * sigma2)).sum()
    out: np.ndarray = np.exp(-np.asarray(x, dtype=float) ** 2 / (2 * sigma2)) / z
    return out
