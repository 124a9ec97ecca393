import DrivebusConfiguration
import DrivebusJournal
import DrivebusSchema

/// Why a request was refused. Every error that comes from the input names the field, so the
/// person setting up a phone app can see what to fix.
public struct IngestError: Error, Sendable, Equatable, CustomStringConvertible {
    public let status: Int
    /// Stable: `ingest.invalid_field`, `ingest.unauthorized`, `ingest.forbidden`,
    /// `ingest.too_large`, `ingest.malformed_json`, `ingest.overloaded`, `ingest.not_found`.
    public let code: String
    public let message: String
    public let field: String?

    public init(status: Int, code: String, message: String, field: String? = nil) {
        self.status = status
        self.code = code
        self.message = message
        self.field = field
    }

    public var description: String { field.map { "\(code) (\($0)): \(message)" } ?? "\(code): \(message)" }

    public static func invalid(_ field: String, _ message: String) -> IngestError {
        IngestError(status: 400, code: "ingest.invalid_field", message: "\(field): \(message)", field: field)
    }

    public static func malformedJSON(_ detail: String, field: String = "body") -> IngestError {
        IngestError(status: 400, code: "ingest.malformed_json", message: "body is not valid JSON: \(detail)", field: field)
    }

    public static func unauthorized(_ message: String, field: String = "token") -> IngestError {
        IngestError(status: 401, code: "ingest.unauthorized", message: message, field: field)
    }

    public static func forbidden(_ message: String, field: String) -> IngestError {
        IngestError(status: 403, code: "ingest.forbidden", message: message, field: field)
    }

    public static func tooLarge(_ message: String, field: String) -> IngestError {
        IngestError(status: 413, code: "ingest.too_large", message: message, field: field)
    }

    public static func overloaded(_ message: String) -> IngestError {
        IngestError(status: 503, code: "ingest.overloaded", message: message)
    }

    /// `{"error":{"code","message","field"}}`
    public var json: [UInt8] {
        var writer = JSONWriter()
        writer.beginObject()
        writer.key("error")
        writer.beginObject()
        writer.key("code"); writer.string(code)
        writer.key("field")
        if let field { writer.string(field) } else { writer.string("") }
        writer.key("message"); writer.string(message)
        writer.endObject()
        writer.endObject()
        return writer.bytes
    }
}
