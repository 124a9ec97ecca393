import Foundation

/// The phone apps drivebus can set up.
public enum PhoneApp: String, CaseIterable, Sendable {
    case owntracks, overland, traccar, gpslogger
}

/// What to enter in each app, and the setup link where the app has one: for `drivebus device`
/// in a terminal and for the dashboard's setup code.
public struct PhoneSetup: Sendable {
    public let device: String
    public let token: String
    /// Where the phone reaches ingest, without a trailing slash.
    public let base: String

    public init(device: String, token: String, base: String) {
        self.device = device
        self.token = token
        self.base = base.hasSuffix("/") ? String(base.dropLast()) : base
    }

    /// `ingest.public_url`, or `http://HOST:PORT` from `ingest.listen`; a wildcard address
    /// becomes this machine's name.
    public static func base(_ config: DrivebusConfig) -> String {
        if let url = config.ingest.publicURL { return url }
        let listen = config.ingest.listen
        let host = ["0.0.0.0", "::", ""].contains(listen.host) ? ProcessInfo.processInfo.hostName : listen.host
        return "http://\(host.contains(":") ? "[\(host)]" : host):\(listen.port)"
    }

    /// OwnTracks' remote configuration: `owntracks:///config?inline=` and the base64 of its JSON.
    public var ownTracksLink: String {
        let settings: [String: Any] = [
            "_type": "configuration", "mode": 3, "url": base + "/owntracks", "auth": true,
            "username": device, "password": token, "deviceId": device, "tid": String(device.prefix(2)),
        ]
        let json = (try? JSONSerialization.data(withJSONObject: settings, options: [.sortedKeys])) ?? Data()
        return "owntracks:///config?inline=" + Self.queryEscaped(json.base64EncodedString())
    }

    /// Overland's setup link: endpoint, token and device id.
    public var overlandLink: String {
        "overland://setup?url=\(Self.queryEscaped(base + "/overland"))&token=\(Self.queryEscaped(token))&device_id=\(Self.queryEscaped(device))"
    }

    public var gpsLoggerURL: String {
        base + "/gpslogger?lat=%LAT&lon=%LON&time=%TIME&spd=%SPD&alt=%ALT&acc=%ACC&dir=%DIR&batt=%BATT&token=" + token
    }

    public var traccarURL: String { base + "/?token=" + token }

    /// What the QR code holds: the app's setup link, or the URL to enter.
    public func code(for app: PhoneApp) -> String {
        switch app {
        case .owntracks: ownTracksLink
        case .overland: overlandLink
        case .traccar: traccarURL
        case .gpslogger: gpsLoggerURL
        }
    }

    /// What to do with the code, and the settings to enter by hand instead.
    public func steps(for app: PhoneApp) -> (scan: String, byHand: String) {
        switch app {
        case .owntracks:
            ("OwnTracks: scan this code with the phone's camera (or open the link on the phone), then accept the configuration in OwnTracks.",
             "By hand: Preferences → Connection → Mode HTTP, URL \(base)/owntracks, user \(device), password \(token).")
        case .overland:
            ("Overland: scan this code with the iPhone's camera (or open the link on it).",
             "By hand: Settings → Receiver Endpoint \(base)/overland, Access Token \(token), Device ID \(device).")
        case .traccar:
            ("Traccar Client: enter this as the server URL (the code holds it, to copy from a scan).",
             "Server URL: \(traccarURL)\nDevice identifier: \(device)")
        case .gpslogger:
            ("GPSLogger: Logging details → Log to custom URL → URL (the code holds it, to copy from a scan).", "URL: \(gpsLoggerURL)")
        }
    }

    static func queryEscaped(_ text: String) -> String {
        var allowed = CharacterSet.urlQueryAllowed
        allowed.remove(charactersIn: ":&=+/?#")
        return text.addingPercentEncoding(withAllowedCharacters: allowed) ?? text
    }
}
