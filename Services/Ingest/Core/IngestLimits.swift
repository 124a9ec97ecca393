/// Every size a client controls, with the answer when it is over: a JSON error naming the field
/// and the limit, and nothing stored. Documented in docs/limits.md.
public enum IngestLimits {
    /// A label: `tid`, `topic`, `device_id`, a region, a candidate's or instructor's name, any
    /// other string field or parameter value.
    public static let labelBytes = 256
    /// A driving-school session's note.
    public static let noteBytes = 2000
    /// Fixes or motion samples in one batch (Overland sends 50 to 1,000); more answers 413.
    public static let batchItems = 10_000
    /// The request line's target: path and query (GPSLogger and OsmAnd send everything there).
    public static let urlBytes = 8192
    /// All header names and values together.
    public static let headerBytes = 16_384
    /// The body of an endpoint that takes one position or one small object; batches may use up
    /// to `ingest.max_body_bytes` (8 MiB by default).
    public static let smallBodyBytes = 65_536

    static func tooLong(_ field: String, limit: Int) -> IngestError {
        IngestError(status: 400, code: "ingest.too_long", message: "\(field): longer than the limit of \(limit) bytes", field: field)
    }

}
