/// SplitMix64 (Steele, Lea and Flood, 2014): a tiny seeded generator for synthetic tracks, zones
/// and noise, so that tests and benchmarks draw the same data on every run and a failure can be
/// replayed. Not for anything that needs unpredictability.
public struct SplitMix64: RandomNumberGenerator, Sendable {
    public var state: UInt64

    public init(seed: UInt64) { state = seed }

    public mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }

    /// Uniform in [0, 1), from the top 53 bits.
    public mutating func unit() -> Double { Double(next() >> 11) / Double(1 << 53) }

    /// Uniform in [-1, 1).
    public mutating func signed() -> Double { unit() * 2 - 1 }

    /// Uniform in `-amplitude..<amplitude`.
    public mutating func uniform(_ amplitude: Double) -> Double { signed() * amplitude }

    /// Uniform in `range`.
    public mutating func next(in range: ClosedRange<Double>) -> Double {
        range.lowerBound + (range.upperBound - range.lowerBound) * unit()
    }
}
