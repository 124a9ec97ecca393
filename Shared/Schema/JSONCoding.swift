import Foundation

/// The bus's JSON conventions in one place: times are RFC 3339 UTC strings with milliseconds, and
/// keys are spelled out snake_case in each type's `CodingKeys`.
public enum BusJSON {
    public static func encoder() -> JSONEncoder {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.withoutEscapingSlashes, .sortedKeys]
        encoder.dateEncodingStrategy = .custom { date, encoder in
            var container = encoder.singleValueContainer()
            try container.encode(RFC3339.format(date))
        }
        encoder.nonConformingFloatEncodingStrategy = .throw
        return encoder
    }

    public static func decoder() -> JSONDecoder {
        let decoder = JSONDecoder()
        decoder.dateDecodingStrategy = .custom { decoder in
            let container = try decoder.singleValueContainer()
            let text = try container.decode(String.self)
            guard let date = RFC3339.parse(text) else {
                throw DecodingError.dataCorruptedError(
                    in: container, debugDescription: "expected an RFC 3339 time, got \"\(text)\"")
            }
            return date
        }
        return decoder
    }

    // Encoders and decoders are safe to share between threads once configured.
    private static let sharedEncoder = encoder()
    private static let sharedDecoder = decoder()

    public static func encode(_ value: some Encodable) throws -> [UInt8] {
        if let fast = value as? any FastJSONEncodable { return written(fast) }
        return Array(try sharedEncoder.encode(value))
    }

    /// The hand-written types, dispatched statically: no existential box or dynamic cast per
    /// message on the hot path.
    public static func encode<T: Encodable & FastJSONEncodable>(_ value: T) -> [UInt8] { written(value) }

    public static func decode<T: Decodable & FastJSONDecodable>(_ type: T.Type, from bytes: [UInt8]) throws(JSONReader.Failure) -> T {
        try read(type, from: bytes)
    }

    public static func decode<T: Decodable>(_ type: T.Type, from bytes: [UInt8]) throws -> T {
        if let fast = type as? any FastJSONDecodable.Type { return try read(fast, from: bytes) as! T }
        return try sharedDecoder.decode(type, from: Data(bytes))
    }

    private static func written(_ value: some FastJSONEncodable) -> [UInt8] {
        var writer = JSONWriter()
        value.writeJSON(to: &writer)
        return writer.bytes
    }

    private static func read<T: FastJSONDecodable>(_ type: T.Type, from bytes: [UInt8]) throws(JSONReader.Failure) -> T {
        try read(whole: bytes) { (reader: inout JSONReader) throws(JSONReader.Failure) in try T(reading: &reader) }
    }

    /// The one value `read` makes of `bytes`, which must hold nothing after it but space.
    static func read<T>(
        whole bytes: [UInt8], _ read: (inout JSONReader) throws(JSONReader.Failure) -> T
    ) throws(JSONReader.Failure) -> T {
        var reader = JSONReader(bytes)
        let value = try read(&reader)
        try reader.finish()
        return value
    }
}
