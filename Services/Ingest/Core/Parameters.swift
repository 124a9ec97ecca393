import Foundation

/// Query or form parameters in the order they came. The first occurrence of a name wins.
public struct Parameters: Sendable, Equatable {
    public private(set) var pairs: [(name: String, value: String)] = []

    public init(_ pairs: [(String, String)] = []) {
        self.pairs = pairs.map { (name: $0.0, value: $0.1) }
    }

    public static func == (a: Parameters, b: Parameters) -> Bool {
        a.pairs.map(\.name) == b.pairs.map(\.name) && a.pairs.map(\.value) == b.pairs.map(\.value)
    }

    /// Parses `a=1&b=x+y%21`. Returns nil for a malformed percent-escape.
    public init?(urlEncoded text: Substring) {
        for part in text.split(separator: "&", omittingEmptySubsequences: true) {
            let (rawName, rawValue) = part.firstIndex(of: "=").map { (part[..<$0], part[part.index(after: $0)...]) } ?? (part, "")
            guard let name = Self.decode(rawName), let value = Self.decode(rawValue) else { return nil }
            pairs.append((name, value))
        }
    }

    private static func decode(_ text: Substring) -> String? {
        text.replacingOccurrences(of: "+", with: " ").removingPercentEncoding
    }

    public subscript(name: String) -> String? { pairs.first { $0.name == name }?.value }

    /// The first of `names` that is present, with the name it came under (for error messages).
    public func first(_ names: String...) -> (name: String, value: String)? {
        for name in names { if let value = self[name] { return (name, value) } }
        return nil
    }

    public var isEmpty: Bool { pairs.isEmpty }

    public mutating func append(_ other: Parameters) { pairs += other.pairs }
}
