import Foundation
import Yams

/// A config file that cannot be used. Its description is the one line start-up prints:
/// `config error: ingest.listen: expected HOST:PORT, got "5055"`.
public struct ConfigError: Error, Sendable, Equatable, CustomStringConvertible {
    /// The key's path, e.g. `devices[1].token`; empty for the file as a whole.
    public let path: String
    public let reason: String

    public init(path: String, reason: String) {
        self.path = path
        self.reason = reason
    }

    public var code: String { "config.invalid" }

    public var description: String {
        path.isEmpty ? "config error: \(reason)" : "config error: \(path): \(reason)"
    }
}

/// Reads one YAML mapping while tracking the key path, so every error names the key, and
/// refusing keys it does not know, so a typo is never silently ignored.
package struct ConfigMapping {
    package let path: String
    private let entries: [String: Node]

    package init(_ node: Node?, path: String, allowed: Set<String>) throws(ConfigError) {
        self.path = path
        guard let node else {
            entries = [:]
            return
        }
        if node.null != nil {
            entries = [:]
            return
        }
        guard case .mapping(let mapping) = node else {
            throw ConfigError(path: path, reason: "expected a mapping of keys")
        }
        var entries: [String: Node] = [:]
        for (key, value) in mapping {
            guard let name = key.string else { throw ConfigError(path: path, reason: "keys must be strings") }
            let keyPath = Self.join(path, name)
            guard allowed.contains(name) else {
                throw ConfigError(path: keyPath, reason: "unknown key (known here: \(allowed.sorted().joined(separator: ", ")))")
            }
            guard entries[name] == nil else { throw ConfigError(path: keyPath, reason: "key appears twice") }
            entries[name] = value
        }
        self.entries = entries
    }

    package static func join(_ path: String, _ key: String) -> String { path.isEmpty ? key : "\(path).\(key)" }

    package func keyPath(_ key: String) -> String { Self.join(path, key) }

    package func has(_ key: String) -> Bool { entries[key] != nil && entries[key]?.null == nil }

    package func node(_ key: String) -> Node? { entries[key] }

    package func mapping(_ key: String, allowed: Set<String>) throws(ConfigError) -> ConfigMapping {
        try ConfigMapping(entries[key], path: keyPath(key), allowed: allowed)
    }

    /// The items of a sequence, each with its path (`devices[0]`).
    package func sequence(_ key: String) throws(ConfigError) -> [(node: Node, path: String)] {
        guard let node = entries[key], node.null == nil else { return [] }
        guard case .sequence(let items) = node else {
            throw ConfigError(path: keyPath(key), reason: "expected a list")
        }
        return items.enumerated().map { ($0.element, "\(keyPath(key))[\($0.offset)]") }
    }

    package func string(_ key: String) throws(ConfigError) -> String? {
        guard let node = entries[key], node.null == nil else { return nil }
        guard case .scalar(let scalar) = node else {
            throw ConfigError(path: keyPath(key), reason: "expected a string")
        }
        return scalar.string
    }

    package func string(_ key: String, default value: String) throws(ConfigError) -> String {
        try string(key) ?? value
    }

    package func requiredString(_ key: String) throws(ConfigError) -> String {
        guard let value = try string(key), !value.isEmpty else {
            throw ConfigError(path: keyPath(key), reason: "is required")
        }
        return value
    }

    package func double(_ key: String, default value: Double, in range: ClosedRange<Double>) throws(ConfigError) -> Double {
        guard let node = entries[key], node.null == nil else { return value }
        guard let number = node.float, number.isFinite else {
            throw ConfigError(path: keyPath(key), reason: "expected a number, got \(describe(node))")
        }
        guard range.contains(number) else {
            throw ConfigError(path: keyPath(key), reason: "must be from \(format(range.lowerBound)) to \(format(range.upperBound)), got \(format(number))")
        }
        return number
    }

    package func int(_ key: String, default value: Int, in range: ClosedRange<Int>) throws(ConfigError) -> Int {
        guard let node = entries[key], node.null == nil else { return value }
        guard let number = node.int else {
            throw ConfigError(path: keyPath(key), reason: "expected an integer, got \(describe(node))")
        }
        guard range.contains(number) else {
            throw ConfigError(path: keyPath(key), reason: "must be from \(range.lowerBound) to \(range.upperBound), got \(number)")
        }
        return number
    }

    package func bool(_ key: String, default value: Bool) throws(ConfigError) -> Bool {
        guard let node = entries[key], node.null == nil else { return value }
        guard let flag = node.bool else {
            throw ConfigError(path: keyPath(key), reason: "expected true or false, got \(describe(node))")
        }
        return flag
    }

    private func describe(_ node: Node) -> String {
        switch node {
        case .scalar(let scalar): "\"\(scalar.string)\""
        case .mapping: "a mapping"
        case .sequence: "a list"
        case .alias: "an alias"
        }
    }

    private func format(_ number: Double) -> String {
        number == number.rounded() && abs(number) < 1e15 ? String(Int64(number)) : String(number)
    }
}
