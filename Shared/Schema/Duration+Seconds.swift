extension Duration {
    /// The duration as seconds, for figures: uptimes, waits, benchmark rates.
    public var inSeconds: Double {
        Double(components.seconds) + Double(components.attoseconds) / 1e18
    }
}
