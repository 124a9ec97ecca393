import DrivebusConfiguration
import DrivebusJournal
import DrivebusSchema
import DrivebusTrackFormats
import Foundation

/// Which device a request speaks for. The token decides; a client's own label never does.
public struct DeviceDirectory: Sendable {
    private let tokens: [(token: [UInt8], device: String)]
    /// Devices known by their token's SHA-256 (added with `drivebus device add`).
    private let hashedTokens: [(digest: [UInt8], device: String)]
    private let idAuthDevices: Set<String>
    private let known: Set<String>

    private let digest: @Sendable ([UInt8]) -> [UInt8]

    /// - Parameter digest: SHA-256, for the devices known by their token's digest (the service
    ///   passes `TokenDigest.sha256`; the core does no cryptography of its own).
    public init(_ devices: [DrivebusConfig.Device], digest: @escaping @Sendable ([UInt8]) -> [UInt8] = { _ in [] }) {
        self.digest = digest
        tokens = devices.compactMap { device in device.token.map { (Array($0.utf8), device.id) } }
        // Only whole SHA-256 digests: an empty one must never match anything.
        hashedTokens = devices.compactMap { device in device.tokenSHA256.flatMap { $0.count == 32 ? ($0, device.id) : nil } }
        idAuthDevices = Set(devices.filter(\.allowIDAuth).map(\.id))
        known = Set(devices.map(\.id))
    }

    public func isKnown(_ device: String) -> Bool { known.contains(device) }

    /// The device whose token this is. Every configured token is compared, in constant time, so
    /// the answer's timing says nothing about how much of a token matched or which one did.
    public func device(forToken token: String) -> String? {
        let candidate = Array(token.utf8)
        var found: String?
        for entry in tokens where Self.constantTimeEqual(candidate, entry.token) {
            found = entry.device
        }
        if !hashedTokens.isEmpty {
            let presented = digest(candidate)
            for entry in hashedTokens where Self.constantTimeEqual(presented, entry.digest) {
                found = entry.device
            }
        }
        return found
    }

    /// Traccar Client sends no secret: a device with `allow_id_auth` is known by its id alone.
    public func device(forID id: String) -> String? {
        idAuthDevices.contains(id) ? id : nil
    }

    static func constantTimeEqual(_ a: [UInt8], _ b: [UInt8]) -> Bool {
        var difference = UInt8(truncatingIfNeeded: a.count ^ b.count) | (a.count == b.count ? 0 : 1)
        let count = max(a.count, b.count)
        for index in 0..<count {
            let x = index < a.count ? a[index] : 0
            let y = index < b.count ? b[index] : 0
            difference |= x ^ y
        }
        return difference == 0
    }

    /// A token from `Authorization: Bearer …`, from Basic auth (the password), or from a `token`
    /// parameter, in that order.
    public static func token(headers: [String: String], parameters: Parameters) -> String? {
        if let authorization = headers["authorization"].map({ Whitespace.trimmed($0) }) {
            let parts = authorization.split(separator: " ", maxSplits: 1)
            if parts.count == 2 {
                let scheme = parts[0].lowercased()
                let value = Whitespace.trimmed(String(parts[1]))
                if scheme == "bearer", !value.isEmpty { return value }
                if scheme == "basic", let data = Data(base64Encoded: value),
                   let pair = String(data: data, encoding: .utf8), let colon = pair.firstIndex(of: ":") {
                    let password = String(pair[pair.index(after: colon)...])
                    if !password.isEmpty { return password }
                }
            }
        }
        if let token = parameters["token"], !token.isEmpty { return token }
        return nil
    }
}
