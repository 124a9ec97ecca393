import Crypto

/// The SHA-256 of a device token: what `drivebus device` keeps instead of the token, and what
/// ingest compares a presented token's digest with.
public enum TokenDigest {
    public static func sha256(_ token: [UInt8]) -> [UInt8] { Array(SHA256.hash(data: token)) }

    public static func hex(_ token: String) -> String {
        sha256(Array(token.utf8)).map { String(format: "%02x", $0) }.joined()
    }
}
