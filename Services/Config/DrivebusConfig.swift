import CheckoutCore
import GeofenceCore
import MQTTCore
import ScorerCore
import StatsCore
import TripsCore
import DrivebusSchema
import DrivebusSettings
import DrivebusGeo
import DrivebusRoadLimits
import Foundation
import Logging
import Yams

/// Everything drivebus can be configured with. One YAML file holds it all; every process reads
/// and validates the whole file, so a typo anywhere stops every process with the same message.
public struct DrivebusConfig: Sendable, Equatable {
    /// Absolute; relative paths in the file are taken from the working directory.
    /// What every process needs: state directory, logging, heartbeat, bus, supervisor.
    public var process: ProcessSettings
    public var devices: [Device]
    public var ingest: Ingest
    public var stats: Stats
    public var checkout: CheckoutConfiguration
    /// Zones, gates and the `geofence:` thresholds.
    public var geofence: GeofenceConfiguration
    public var trips: TripsConfiguration
    public var scorer: ScorerConfiguration
    /// Own car against rentals; priced by the stats service (docs/costs.md).
    public var costs: CostsConfiguration
    /// The MQTT bridge (OwnTracks over MQTT, Home Assistant); off when nil.
    public var mqtt: MQTTConfiguration?
    /// How long raw data is kept (docs/data.md); everything is kept for ever by default.
    public var retention = Retention()

    public struct Retention: Sendable, Equatable {
        /// Fixes older than this many days leave the journal and stats' table of fixes; trips
        /// keep their tracks, scores and figures. Nil: kept for ever.
        public var rawFixesDays: Double?
        /// The same for motion samples (in the journal only: stats does not keep them).
        public var motionDays: Double?
        /// What the services derived (trips with their tracks, scores, zone crossings, gate
        /// calls, check-outs) leaves their event journals once it ended this many days ago;
        /// stats keeps its own copy. Nil: kept for ever.
        public var derivedEventsDays: Double?

        public init(rawFixesDays: Double? = nil, motionDays: Double? = nil, derivedEventsDays: Double? = nil) {
            self.rawFixesDays = rawFixesDays
            self.motionDays = motionDays
            self.derivedEventsDays = derivedEventsDays
        }

        /// The kinds of journal record to expire, each with the time before which they go.
        public func expiring(now: Date) -> [(type: String, before: Date)] {
            [("fix", rawFixesDays), ("motion", motionDays)].compactMap { type, days in days.map { (type, now.addingTimeInterval(-$0 * 86_400)) } }
        }
    }

    public struct Device: Sendable, Equatable {
        public var id: String
        /// Never logged. `nil` for a device that authenticates by id alone, or by `tokenSHA256`.
        public var token: String?
        /// For a device added with `drivebus device add`: only its token's SHA-256 is known.
        public var tokenSHA256: [UInt8]?
        /// Traccar Client sends no secret: accept its `id` as the credential, as Traccar does.
        public var allowIDAuth: Bool
        /// The device's home zone, for time-away statistics.
        public var home: String?

        public init(id: String, token: String?, tokenSHA256: [UInt8]? = nil, allowIDAuth: Bool = false, home: String? = nil) {
            self.id = id
            self.token = token
            self.tokenSHA256 = tokenSHA256
            self.allowIDAuth = allowIDAuth
            self.home = home
        }
    }

    public struct Listen: Sendable, Equatable, CustomStringConvertible {
        public var host: String
        public var port: Int
        public init(host: String, port: Int) {
            self.host = host
            self.port = port
        }
        public var description: String { host.contains(":") ? "[\(host)]:\(port)" : "\(host):\(port)" }
        /// Reachable from this machine only.
        public var isLoopback: Bool { host == "localhost" || host == "::1" || host.hasPrefix("127.") }
    }

    public struct Ingest: Sendable, Equatable {
        public var listen = Listen(host: "127.0.0.1", port: 5055)
        /// Where phones reach ingest (a reverse proxy's `https://…`), for setup codes; from
        /// `listen` when absent.
        public var publicURL: String?
        public var maxBodyBytes = 8 * 1024 * 1024
    }

    public struct Stats: Sendable, Equatable {
        public var listen = Listen(host: "127.0.0.1", port: 8091)
        /// Gaps between fixes longer than this are not counted as time away from home.
        public var maxGapS = 3600.0
        /// `stats.map`: the interactive map page (docs/map.md).
        public var map = Map()
        /// `stats.allowed_hosts`: names besides this machine's that requests may be addressed
        /// to (a reverse proxy's public name), lower-case, without a port.
        public var allowedHosts: [String] = []

        public struct Map: Sendable, Equatable {
            /// A base map's tile URL (`{z}/{x}/{y}`), the user's choice of provider; without it the
            /// trips draw on a plain background with a graticule.
            public var tileURL: String?
            /// The base map's attribution, shown on the map as its provider asks.
            public var attribution: String?
            /// Where Leaflet is installed (Debian's `libjs-leaflet`); the page serves it from there.
            public var leafletDir = "/usr/share/javascript/leaflet"
        }
    }

    /// The built-in defaults: one home, everything on loopback, state under `./var`.
    public static func defaults(workingDirectory: String = FileManager.default.currentDirectoryPath) -> DrivebusConfig {
        DrivebusConfig(
            process: ProcessSettings(workingDirectory: workingDirectory),
            devices: [],
            ingest: Ingest(),
            stats: Stats(),
            checkout: CheckoutConfiguration(),
            geofence: GeofenceConfiguration(),
            trips: TripsConfiguration(),
            scorer: ScorerConfiguration(),
            costs: CostsConfiguration(),
            mqtt: nil
        )
    }

}

extension DrivebusConfig {
    /// The processes this config runs: the standard ones, and drivebus-mqtt with `mqtt:`.
    public var services: [ServiceName] { ServiceName.standard + (mqtt == nil ? [] : [.mqtt]) }
    public var stateDir: String { process.stateDir }
    public var layout: StateLayout { process.layout }
    public var logLevel: Logger.Level { process.logLevel }
}

// MARK: - Loading

extension DrivebusConfig {
    /// Finds the config (see `ConfigFile.locate`) and parses it, or takes the built-in defaults.
    public static func load(
        explicitPath: String?,
        environment: [String: String] = ProcessInfo.processInfo.environment,
        workingDirectory: String = FileManager.default.currentDirectoryPath
    ) throws(ConfigError) -> (DrivebusConfig, ConfigOrigin) {
        guard let file = try ConfigFile.locate(explicitPath: explicitPath, environment: environment, workingDirectory: workingDirectory) else {
            let config = defaults(workingDirectory: workingDirectory)
            try config.process.validateSocketPaths()
            return (config, .builtInDefaults)
        }
        return (try parse(yaml: file.text, workingDirectory: workingDirectory, environment: environment), .file(file.path))
    }

    /// Where and what the YAML problem is, without the text around it: Yams' own description
    /// quotes the file's lines (the whole file, for a key given twice), and the file holds tokens
    /// and secrets that must never reach a log.
    static func yamlProblem(_ error: any Error) -> String {
        switch error as? YamlError {
        case .scanner(_, let problem, let mark, _)?, .parser(_, let problem, let mark, _)?, .composer(_, let problem, let mark, _)?:
            return "line \(mark.line), column \(mark.column): \(problem)"
        case .reader(let problem, _, _, _)?:
            return problem
        case .duplicatedKeysInMapping(let duplicates, let context)?:
            return "a key appears twice, at line \(context.mark.line): \(duplicates.sorted().joined(separator: ", "))"
        case .dataCouldNotBeDecoded?:
            return "the file is not UTF-8 text"
        default:
            return "the file could not be read as YAML"
        }
    }

    public static func parse(
        yaml: String, workingDirectory: String = FileManager.default.currentDirectoryPath,
        environment: [String: String] = ProcessInfo.processInfo.environment
    ) throws(ConfigError) -> DrivebusConfig {
        let root: Node?
        do {
            root = try Yams.compose(yaml: yaml)
        } catch {
            throw ConfigError(path: "", reason: "not valid YAML: \(Self.yamlProblem(error))")
        }
        let top = try ConfigMapping(root, path: "", allowed: [
            "state_dir", "log_level", "heartbeat_interval_s", "bus", "devices", "ingest", "stats", "supervisor", "checkout",
            "zones", "gates", "geofence", "trips", "scorer", "costs", "mqtt", "retention",
        ])
        var config = defaults(workingDirectory: workingDirectory)
        config.process = try ProcessSettings.parse(top, workingDirectory: workingDirectory)
        config.devices = try parseDevices(top)
        let ingest = try top.mapping("ingest", allowed: ["listen", "max_body_bytes", "public_url"])
        if let url = try ingest.string("public_url") {
            guard let parsed = URLComponents(string: url), ["http", "https"].contains(parsed.scheme ?? ""), parsed.host?.isEmpty == false,
                  parsed.query == nil, parsed.fragment == nil else {
                throw ConfigError(path: ingest.keyPath("public_url"), reason: "expected http(s)://host[:port][/path], got \"\(url)\"")
            }
            config.ingest.publicURL = url
        }
        config.ingest.listen = try parseListen(ingest, default: config.ingest.listen)
        config.ingest.maxBodyBytes = try ingest.int("max_body_bytes", default: config.ingest.maxBodyBytes, in: 1024...(1 << 30))
        let stats = try top.mapping("stats", allowed: ["listen", "max_gap_s", "map", "allowed_hosts"])
        config.stats.listen = try parseListen(stats, default: config.stats.listen)
        for (node, path) in try stats.sequence("allowed_hosts") {
            guard let name = node.string?.lowercased(), !name.isEmpty, name.utf8.count <= 253,
                  name.utf8.allSatisfy({ (0x61...0x7A).contains($0) || (0x30...0x39).contains($0) || $0 == UInt8(ascii: ".") || $0 == UInt8(ascii: "-") })
            else { throw ConfigError(path: path, reason: "expected a host name such as drivebus.example.org (no port, no scheme)") }
            config.stats.allowedHosts.append(name)
        }
        config.stats.maxGapS = try stats.double("max_gap_s", default: config.stats.maxGapS, in: 1...31_536_000)
        let map = try stats.mapping("map", allowed: ["tile_url", "attribution", "leaflet_dir"])
        if let url = try map.string("tile_url") {
            guard let scheme = URLComponents(string: url.replacingOccurrences(of: "{", with: "%7B").replacingOccurrences(of: "}", with: "%7D"))?.scheme,
                  ["http", "https"].contains(scheme), url.contains("{z}"), url.contains("{x}"), url.contains("{y}") else {
                throw ConfigError(path: map.keyPath("tile_url"), reason: "expected an http(s) URL with {z}, {x} and {y}, got \"\(url)\"")
            }
            config.stats.map.tileURL = url
        }
        config.stats.map.attribution = try map.string("attribution")
        config.stats.map.leafletDir = try map.string("leaflet_dir", default: config.stats.map.leafletDir)
        config.checkout = try parseCheckout(top.mapping("checkout", allowed: [
            "grace_period_s", "lead_time_s", "min_confidence", "max_ride_s", "riding_speed_mps",
            "walking_speed_max_mps", "walk_confirm_s", "walk_min_distance_m", "walk_aside_m", "max_accuracy_m",
        ]))
        config.geofence = try parseGeofence(top, devices: config.devices)
        config.trips = try parseTrips(top)
        config.scorer = try parseScorer(top, zones: config.geofence.zones)
        config.costs = try parseCosts(top.mapping("costs", allowed: ["currency", "rental_keep_s", "own_car", "rentals"]))
        config.mqtt = try parseMQTT(top, environment: environment)
        let retention = try top.mapping("retention", allowed: ["raw_fixes_days", "motion_days", "derived_events_days"])
        // At least a day: a shorter retention would take fixes that trips are still being cut from.
        if retention.has("raw_fixes_days") { config.retention.rawFixesDays = try retention.double("raw_fixes_days", default: 0, in: 1...36_500) }
        if retention.has("motion_days") { config.retention.motionDays = try retention.double("motion_days", default: 0, in: 1...36_500) }
        if retention.has("derived_events_days") {
            config.retention.derivedEventsDays = try retention.double("derived_events_days", default: 0, in: 1...36_500)
        }
        // The services' event journals are kept by the kit, which sees only the process settings.
        config.process.derivedEventsDays = config.retention.derivedEventsDays
        try config.process.validateSocketPaths()
        return config
    }

    static func parseGeofence(_ top: ConfigMapping, devices: [Device]) throws(ConfigError) -> GeofenceConfiguration {
        let section = try top.mapping("geofence", allowed: ["hysteresis_m", "min_dwell_s"])
        var geofence = GeofenceConfiguration()
        geofence.hysteresisM = try section.double("hysteresis_m", default: geofence.hysteresisM, in: 0...10_000)
        geofence.minDwellS = try section.double("min_dwell_s", default: geofence.minDwellS, in: 0...86_400 * 7)
        for (node, path) in try top.sequence("zones") {
            let entry = try ConfigMapping(node, path: path, allowed: ["id", "circle", "polygon", "speed_limit_kmh"])
            let id = try entry.requiredString("id")
            let shape: Zone.Shape
            switch (entry.has("circle"), entry.has("polygon")) {
            case (true, false):
                let circle = try entry.mapping("circle", allowed: ["lat", "lon", "radius_m"])
                guard circle.has("lat"), circle.has("lon"), circle.has("radius_m") else {
                    throw ConfigError(path: circle.path, reason: "needs lat, lon and radius_m")
                }
                shape = .circle(
                    center: Coordinate(lat: try circle.double("lat", default: 0, in: -90...90), lon: try circle.double("lon", default: 0, in: -180...180)),
                    radiusM: try circle.double("radius_m", default: 0, in: 1...1_000_000))
            case (false, true):
                var vertices: [Coordinate] = []
                for (pair, pairPath) in try entry.sequence("polygon") {
                    guard case .sequence(let numbers) = pair, numbers.count == 2, let lat = numbers[0].float, let lon = numbers[1].float,
                          (-90...90).contains(lat), (-180...180).contains(lon) else {
                        throw ConfigError(path: pairPath, reason: "expected [lat, lon] with lat from -90 to 90 and lon from -180 to 180")
                    }
                    vertices.append(Coordinate(lat: lat, lon: lon))
                }
                guard vertices.count >= 3 else { throw ConfigError(path: entry.keyPath("polygon"), reason: "needs at least 3 [lat, lon] points") }
                shape = .polygon(vertices)
            default:
                throw ConfigError(path: path, reason: "needs exactly one of circle or polygon")
            }
            let limit = entry.has("speed_limit_kmh") ? try entry.double("speed_limit_kmh", default: 0, in: 1...500) : nil
            geofence.zones.append(Zone(id: id, shape: shape, speedLimitKmh: limit))
        }
        for (node, path) in try top.sequence("gates") {
            let entry = try ConfigMapping(node, path: path, allowed: [
                "id", "zone", "devices", "on", "min_speed_mps", "motion", "cooldown_s", "max_age_s", "webhook",
            ])
            var gateDevices: [String]?
            if entry.has("devices") {
                gateDevices = try entry.sequence("devices").map { (node, itemPath) throws(ConfigError) -> String in
                    guard let id = node.string, devices.contains(where: { $0.id == id }) else {
                        throw ConfigError(path: itemPath, reason: "is not a device listed under devices")
                    }
                    return id
                }
            }
            let on = try entry.string("on") ?? "enter"
            guard let trigger = Gate.Trigger(rawValue: on) else { throw ConfigError(path: entry.keyPath("on"), reason: "expected enter or exit, got \"\(on)\"") }
            var motion: MotionSample.Activity?
            if let name = try entry.string("motion") {
                guard let activity = MotionSample.Activity(rawValue: name) else {
                    throw ConfigError(path: entry.keyPath("motion"), reason: "expected an activity such as automotive, got \"\(name)\"")
                }
                motion = activity
            }
            let hook = try entry.mapping("webhook", allowed: ["url", "method", "headers", "body", "secret", "timeout_s", "retries"])
            var headers: [String: String] = [:]
            if hook.has("headers") {
                guard case .mapping(let mapping)? = hook.node("headers") else { throw ConfigError(path: hook.keyPath("headers"), reason: "expected a mapping of header names to values") }
                for (name, value) in mapping {
                    guard let name = name.string, let value = value.string else { throw ConfigError(path: hook.keyPath("headers"), reason: "header names and values must be strings") }
                    headers[name] = value
                }
            }
            let webhook = Webhook(
                url: try hook.requiredString("url"), method: (try hook.string("method") ?? "POST").uppercased(), headers: headers,
                body: try hook.string("body") ?? Webhook.defaultBody, secret: try hook.string("secret"),
                timeoutS: try hook.double("timeout_s", default: 5, in: 0.1...120), retries: try hook.int("retries", default: 100, in: 0...100))
            geofence.gates.append(Gate(
                id: try entry.requiredString("id"), zone: try entry.requiredString("zone"), devices: gateDevices, on: trigger,
                minSpeedMps: entry.has("min_speed_mps") ? try entry.double("min_speed_mps", default: 0, in: 0...100) : nil,
                motion: motion, cooldownS: try entry.double("cooldown_s", default: 300, in: 0...86_400),
                maxAgeS: try entry.double("max_age_s", default: 120, in: 1...86_400), webhook: webhook))
        }
        do {
            try geofence.validate()
        } catch {
            throw ConfigError(path: error.path, reason: error.reason)
        }
        for (index, device) in devices.enumerated() {
            if let home = device.home, !geofence.zones.contains(where: { $0.id == home }) {
                throw ConfigError(path: "devices[\(index)].home", reason: "names zone \"\(home)\", which is not under zones")
            }
        }
        return geofence
    }

    static func parseTrips(_ top: ConfigMapping) throws(ConfigError) -> TripsConfiguration {
        let keys: [(String, WritableKeyPath<TripsConfiguration, Double>)] = [
            ("min_distance_m", \.minDistanceM), ("min_duration_s", \.minDurationS), ("stop_gap_s", \.stopGapS),
            ("max_speed_mps", \.maxSpeedMps), ("max_accuracy_m", \.maxAccuracyM), ("idle_close_s", \.idleCloseS),
            ("silent_after_s", \.silentAfterS), ("simplify_epsilon_m", \.simplifyEpsilonM), ("ascent_hysteresis_m", \.ascentHysteresisM),
            ("walking_end_s", \.walkingEndS), ("distance_noise_m", \.distanceNoiseM),
        ]
        let section = try top.mapping("trips", allowed: Set(keys.map(\.0)))
        var trips = TripsConfiguration()
        for (key, path) in keys { trips[keyPath: path] = try section.double(key, default: trips[keyPath: path], in: 0...1e9) }
        do {
            try trips.validate()
        } catch {
            throw ConfigError(path: "trips.\(error.key)", reason: error.reason)
        }
        return trips
    }

    static func parseScorer(_ top: ConfigMapping, zones: [Zone]) throws(ConfigError) -> ScorerConfiguration {
        let keys: [(String, WritableKeyPath<ScorerConfiguration, Double>)] = [
            ("harsh_brake_mps2", \.harshBrakeMps2), ("harsh_accel_mps2", \.harshAccelMps2), ("harsh_corner_mps2", \.harshCornerMps2), ("corner_margin", \.cornerMargin),
            ("corner_min_speed_mps", \.cornerMinSpeedMps), ("speeding_tolerance", \.speedingTolerance),
            ("speeding_min_duration_s", \.speedingMinDurationS), ("smoothing_window_s", \.smoothingWindowS), ("max_gap_s", \.maxGapS),
            ("max_accuracy_m", \.maxAccuracyM), ("episode_gap_s", \.episodeGapS), ("release_fraction", \.releaseFraction),
            ("score_min_distance_km", \.scoreMinDistanceKm), ("score_min_duration_s", \.scoreMinDurationS),
            ("speed_variation_calm_mps2", \.speedVariationCalmMps2),
        ]
        let section = try top.mapping("scorer", allowed: Set(keys.map(\.0) + ["speed_limit_kmh", "weights", "history_fixes", "road_class_limits_kmh"]))
        var scorer = ScorerConfiguration()
        for (key, path) in keys { scorer[keyPath: path] = try section.double(key, default: scorer[keyPath: path], in: -1e6...1e9) }
        if section.has("speed_limit_kmh") { scorer.speedLimitKmh = try section.double("speed_limit_kmh", default: 0, in: 1...500) }
        scorer.historyFixes = try section.int("history_fixes", default: scorer.historyFixes, in: 16...1_000_000)
        // Limits for roads from the speed-limit index that have no maxspeed, by OSM class.
        let classes = try section.mapping("road_class_limits_kmh", allowed: Set(RoadClass.allCases.map(\.osmName)))
        for roadClass in RoadClass.allCases where classes.has(roadClass.osmName) {
            scorer.roadClassLimitsKmh[roadClass.osmName] = try classes.double(roadClass.osmName, default: 0, in: 1...300)
        }
        let weightKeys: [(String, WritableKeyPath<ScorerConfiguration.Weights, Double>)] = [
            ("harsh_brake", \.harshBrake), ("harsh_accel", \.harshAccel), ("harsh_corner", \.harshCorner), ("speeding_s_per_h", \.speedingSPerH),
            ("speed_variation", \.speedVariation),
        ]
        let weights = try section.mapping("weights", allowed: Set(weightKeys.map(\.0)))
        for (key, path) in weightKeys { scorer.weights[keyPath: path] = try weights.double(key, default: scorer.weights[keyPath: path], in: 0...1000) }
        // Per-zone limits come from the zones themselves (zones[].speed_limit_kmh).
        scorer.zoneSpeedLimits = zones.filter { $0.speedLimitKmh != nil }
        do {
            try scorer.validate()
        } catch {
            throw ConfigError(path: "scorer.\(error.key)", reason: error.reason)
        }
        return scorer
    }

    static func parseCosts(_ section: ConfigMapping) throws(ConfigError) -> CostsConfiguration {
        var costs = CostsConfiguration()
        costs.currency = try section.string("currency", default: costs.currency)
        costs.rentalKeepS = try section.double("rental_keep_s", default: costs.rentalKeepS, in: 0...2_592_000)
        let ownCar = try section.mapping("own_car", allowed: ["expenses"])
        for (node, path) in try ownCar.sequence("expenses") {
            let entry = try ConfigMapping(node, path: path, allowed: ["date", "category", "amount"])
            let date = try entry.requiredString("date")
            guard RFC3339.parse(date + "T00:00:00Z") != nil else { throw ConfigError(path: entry.keyPath("date"), reason: "expected YYYY-MM-DD, got \"\(date)\"") }
            guard entry.has("amount") else { throw ConfigError(path: entry.keyPath("amount"), reason: "is required") }
            costs.ownCar.expenses.append(.init(
                date: date, category: try entry.string("category", default: "other"),
                amount: try entry.double("amount", default: 0, in: -1e9...1e9)))
        }
        for (node, path) in try section.sequence("rentals") {
            let entry = try ConfigMapping(node, path: path, allowed: ["name", "start_fee", "per_minute", "per_km", "per_hour_cap", "per_day_cap", "min_fee"])
            costs.rentals.append(.init(
                name: try entry.requiredString("name"),
                startFee: try entry.double("start_fee", default: 0, in: 0...1e6),
                perMinute: try entry.double("per_minute", default: 0, in: 0...1e6),
                perKm: try entry.double("per_km", default: 0, in: 0...1e6),
                perHourCap: entry.has("per_hour_cap") ? try entry.double("per_hour_cap", default: 0, in: 0...1e6) : nil,
                perDayCap: entry.has("per_day_cap") ? try entry.double("per_day_cap", default: 0, in: 0...1e6) : nil,
                minFee: try entry.double("min_fee", default: 0, in: 0...1e6)))
        }
        do {
            try costs.validate()
        } catch {
            throw ConfigError(path: error.path, reason: error.reason)
        }
        return costs
    }

    static func parseCheckout(_ section: ConfigMapping) throws(ConfigError) -> CheckoutConfiguration {
        var checkout = CheckoutConfiguration()
        checkout.gracePeriodS = try section.double("grace_period_s", default: checkout.gracePeriodS, in: 0...3600)
        checkout.leadTimeS = try section.double("lead_time_s", default: checkout.leadTimeS, in: 1...3600)
        if let confidence = try section.string("min_confidence") {
            guard let parsed = MotionSample.Confidence(rawValue: confidence) else {
                throw ConfigError(path: section.keyPath("min_confidence"), reason: "expected low, medium or high, got \"\(confidence)\"")
            }
            checkout.minConfidence = parsed
        }
        checkout.maxRideS = try section.double("max_ride_s", default: checkout.maxRideS, in: 60...604_800)
        checkout.ridingSpeedMps = try section.double("riding_speed_mps", default: checkout.ridingSpeedMps, in: 0.5...100)
        checkout.walkingSpeedMaxMps = try section.double("walking_speed_max_mps", default: checkout.walkingSpeedMaxMps, in: 0.1...checkout.ridingSpeedMps)
        checkout.walkConfirmS = try section.double("walk_confirm_s", default: checkout.walkConfirmS, in: 10...3600)
        checkout.walkMinDistanceM = try section.double("walk_min_distance_m", default: checkout.walkMinDistanceM, in: 0...10_000)
        checkout.walkAsideM = try section.double("walk_aside_m", default: checkout.walkAsideM, in: 1...10_000)
        checkout.maxAccuracyM = try section.double("max_accuracy_m", default: checkout.maxAccuracyM, in: 1...100_000)
        return checkout
    }

    static func parseDevices(_ top: ConfigMapping) throws(ConfigError) -> [Device] {
        var devices: [Device] = []
        var seenTokens: [String: String] = [:]
        for (node, path) in try top.sequence("devices") {
            let entry = try ConfigMapping(node, path: path, allowed: ["id", "token", "allow_id_auth", "home"])
            let id = try entry.requiredString("id")
            guard DeviceID.isValid(id) else {
                throw ConfigError(path: entry.keyPath("id"), reason: "must match [A-Za-z0-9_-]{1,64}, got \"\(id)\"")
            }
            guard !devices.contains(where: { $0.id == id }) else {
                throw ConfigError(path: entry.keyPath("id"), reason: "device \"\(id)\" is listed twice")
            }
            let token = try entry.string("token")
            let allowIDAuth = try entry.bool("allow_id_auth", default: false)
            if let token {
                // The token is never echoed back, not even in errors.
                guard token.utf8.count >= 8 else {
                    throw ConfigError(path: entry.keyPath("token"), reason: "must be at least 8 characters")
                }
                if let other = seenTokens[token] {
                    throw ConfigError(path: entry.keyPath("token"), reason: "is the same as device \"\(other)\"'s; each token maps to one device")
                }
                seenTokens[token] = id
            } else if !allowIDAuth {
                throw ConfigError(path: entry.keyPath("token"), reason: "is required unless allow_id_auth is true")
            }
            devices.append(Device(id: id, token: token, allowIDAuth: allowIDAuth, home: try entry.string("home")))
        }
        return devices
    }

    static func parseListen(_ section: ConfigMapping, key: String = "listen", default value: Listen) throws(ConfigError) -> Listen {
        guard let text = try section.string(key) else { return value }
        let path = section.keyPath(key)
        guard let colon = text.lastIndex(of: ":"), let port = Int(text[text.index(after: colon)...]), (1...65535).contains(port) else {
            throw ConfigError(path: path, reason: "expected HOST:PORT with a port from 1 to 65535, got \"\(text)\"")
        }
        var host = String(text[..<colon])
        if host.hasPrefix("[") && host.hasSuffix("]") { host = String(host.dropFirst().dropLast()) }
        guard !host.isEmpty else { throw ConfigError(path: path, reason: "expected HOST:PORT, the host is missing in \"\(text)\"") }
        return Listen(host: host, port: port)
    }
}

extension DrivebusConfig: ServiceConfiguration {
    public static func load(explicitPath: String?) throws(ConfigError) -> (DrivebusConfig, ConfigOrigin) {
        try load(explicitPath: explicitPath, environment: ProcessInfo.processInfo.environment)
    }
}
