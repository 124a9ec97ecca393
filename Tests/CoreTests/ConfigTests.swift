import DrivebusConfiguration
import DrivebusKit
import DrivebusTestSupport
import Foundation
import Testing

@Suite struct ConfigTests {
    func error(_ yaml: String) -> String? {
        do {
            _ = try DrivebusConfig.parse(yaml: yaml, workingDirectory: "/srv")
            return nil
        } catch {
            return error.description
        }
    }

    @Test func defaultsServeOneHomeOnLoopback() throws {
        let config = try DrivebusConfig.parse(yaml: "", workingDirectory: "/srv/home")
        #expect(config.stateDir == "/srv/home/var")
        #expect(config.ingest.listen.description == "127.0.0.1:5055")
        #expect(config.stats.listen.description == "127.0.0.1:8091")
        #expect(config.process.heartbeatIntervalS == 2)
        #expect(config.process.busEndpoints().in.address == "ipc:///srv/home/var/run/bus.in")
        #expect(config.process.busEndpoints().out.address == "ipc:///srv/home/var/run/bus.out")
        #expect(config.layout.rpcEndpoint(.trips) == "ipc:///srv/home/var/run/trips.rpc")
    }

    @Test func readsEveryFoundationKey() throws {
        let config = try DrivebusConfig.parse(yaml: """
            state_dir: /data/drivebus
            log_level: debug
            heartbeat_interval_s: 0.5
            ingest: {listen: "0.0.0.0:6055", max_body_bytes: 1048576}
            stats: {listen: "[::1]:9000"}
            zones: [{id: home, circle: {lat: 48.2, lon: 16.37, radius_m: 100}}]
            devices:
              - {id: car, token: "s3cret-token", home: home}
              - {id: taxi-phone, allow_id_auth: true}
            """, workingDirectory: "/")
        #expect(config.stateDir == "/data/drivebus")
        #expect(config.logLevel == .debug)
        #expect(config.process.heartbeatIntervalS == 0.5)
        #expect(config.ingest.listen == .init(host: "0.0.0.0", port: 6055))
        #expect(config.ingest.maxBodyBytes == 1_048_576)
        #expect(config.stats.listen == .init(host: "::1", port: 9000))
        #expect(config.devices.map(\.id) == ["car", "taxi-phone"])
        #expect(config.devices[0].home == "home")
        #expect(config.devices[1].allowIDAuth)
    }

    @Test(arguments: [
        ("statedir: x", "config error: statedir: unknown key"),
        ("ingest: {port: 5055}", "config error: ingest.port: unknown key"),
        ("ingest: {listen: \"5055\"}", #"config error: ingest.listen: expected HOST:PORT with a port from 1 to 65535, got "5055""#),
        ("ingest: {listen: \"localhost:99999\"}", "config error: ingest.listen: expected HOST:PORT"),
        ("heartbeat_interval_s: fast", #"config error: heartbeat_interval_s: expected a number, got "fast""#),
        ("heartbeat_interval_s: 0", "config error: heartbeat_interval_s: must be from 0.1 to 60, got 0"),
        ("log_level: loud", "config error: log_level: expected one of"),
        ("devices: {car: x}", "config error: devices: expected a list"),
        ("devices: [{id: car}]", "config error: devices[0].token: is required unless allow_id_auth is true"),
        ("devices: [{id: 'my car', token: abcdefgh}]", "config error: devices[0].id: must match"),
        ("devices: [{id: a, token: abcdefgh}, {id: b, token: abcdefgh}]", "config error: devices[1].token: is the same as device \"a\""),
        ("devices: [{id: a, token: short}]", "config error: devices[0].token: must be at least 8 characters"),
        ("devices: [{id: a, token: abcdefgh, colour: red}]", "config error: devices[0].colour: unknown key"),
        ("bus: {in: \"tcp://10.0.0.2:5600\"}", "config error: bus.curve: is required when the bus uses tcp://"),
        ("bus: {in: \"udp://x\"}", "config error: bus.in: expected an ipc:// or tcp:// endpoint"),
        ("ingest: [1, 2]", "config error: ingest: expected a mapping of keys"),
        ("a: [unclosed", "config error: not valid YAML"),
        ("devices: [{id: car, token: abcdefgh, home: house}]", #"config error: devices[0].home: names zone "house", which is not under zones"#),
        ("zones: [{id: a, circle: {lat: 1, lon: 2}}]", "config error: zones[0].circle: needs lat, lon and radius_m"),
        ("zones: [{id: a, polygon: [[1, 2], [3]]}]", "config error: zones[0].polygon[1]: expected [lat, lon]"),
        ("zones: [{id: a, circle: {lat: 1, lon: 2, radius_m: 5}, polygon: [[1,2],[2,3],[3,1]]}]", "config error: zones[0]: needs exactly one of circle or polygon"),
        ("gates: [{id: g, zone: a, webhook: {url: 'http://x/'}}]", "config error: gates[0].zone"),
        ("zones: [{id: a, circle: {lat: 1, lon: 2, radius_m: 50}}]\ngates: [{id: g, zone: a, on: arrive, webhook: {url: 'http://x/'}}]", #"config error: gates[0].on: expected enter or exit, got "arrive""#),
        ("zones: [{id: a, circle: {lat: 1, lon: 2, radius_m: 50}}]\ngates: [{id: g, zone: a}]", "config error: gates[0].webhook.url: is required"),
        ("checkout: {min_confidence: certain}", #"config error: checkout.min_confidence: expected low, medium or high, got "certain""#),
        ("costs: {rentals: [{start_fee: 1}]}", "config error: costs.rentals[0].name: is required"),
        ("costs: {own_car: {expenses: [{date: 2025-13-01, amount: 5}]}}", #"config error: costs.own_car.expenses[0].date: expected YYYY-MM-DD, got "2025-13-01""#),
        ("checkout: {lead_time_s: 0}", "config error: checkout.lead_time_s: must be from 1 to 3600, got 0"),
        (#"stats: {map: {tile_url: "https://tiles.example/{z}/{x}.png"}}"#, #"config error: stats.map.tile_url: expected an http(s) URL with {z}, {x} and {y}"#),
        ("stats: {map: {tiles: x}}", "config error: stats.map.tiles: unknown key"),
        ("retention: {raw_fixes_days: 0.5}", "config error: retention.raw_fixes_days: must be from 1 to 36500, got 0.5"),
        ("retention: {trips_days: 30}", "config error: retention.trips_days: unknown key"),
        ("stats: {allowed_hosts: ['https://drivebus.example.org']}", "config error: stats.allowed_hosts[0]: expected a host name"),
    ])
    func badConfigNamesTheKey(_ yaml: String, _ expected: String) {
        let message = error(yaml)
        #expect(message?.hasPrefix(expected) == true, "got: \(message ?? "no error")")
        #expect(message?.contains("\n") == false)
    }

    /// Yams' own error text quotes the file (all of it, for a key given twice): a config error
    /// names the line and the problem, and never a token or a secret.
    @Test(arguments: [
        ("devices:\n  - id: car\n    token: s3cret-token-one\n    token: s3cret-token-two\n", "config error: not valid YAML: a key appears twice, at line 3: token"),
        ("devices:\n  - id: car\n    token: s3cret-token-one\n  bad: [s3cret\n", "config error: not valid YAML: line "),
    ])
    func yamlErrorsNeverQuoteTheFile(_ yaml: String, _ expected: String) {
        let message = error(yaml) ?? "no error"
        #expect(message.hasPrefix(expected), "got: \(message)")
        #expect(!message.contains("s3cret"))
        #expect(!message.contains("\n"))
    }

    @Test func retentionKeepsEverythingUnlessTold() throws {
        #expect(try DrivebusConfig.parse(yaml: "").retention == .init())
        let retention = try DrivebusConfig.parse(yaml: "retention: {raw_fixes_days: 730, motion_days: 30}").retention
        #expect(retention == .init(rawFixesDays: 730, motionDays: 30))
        let now = Date(timeIntervalSince1970: 1_800_000_000)
        let expiring = retention.expiring(now: now)
        #expect(expiring.map(\.type) == ["fix", "motion"])
        #expect(expiring.map(\.before) == [now.addingTimeInterval(-730 * 86_400), now.addingTimeInterval(-30 * 86_400)])
        // The services' event journals: the kit reads it from the process settings.
        let events = try DrivebusConfig.parse(yaml: "retention: {derived_events_days: 365}")
        #expect(events.retention == .init(derivedEventsDays: 365) && events.process.derivedEventsDays == 365)
        #expect(try DrivebusConfig.parse(yaml: "").process.derivedEventsDays == nil)
    }

    @Test func theMapsBaseLayerIsOptional() throws {
        let none = try DrivebusConfig.parse(yaml: "").stats.map
        #expect(none.tileURL == nil && none.attribution == nil && none.leafletDir == "/usr/share/javascript/leaflet")
        let map = try DrivebusConfig.parse(yaml: #"stats: {map: {tile_url: "https://t.example/{z}/{x}/{y}.png", attribution: "© them", leaflet_dir: /opt/leaflet}}"#).stats.map
        #expect(map.tileURL == "https://t.example/{z}/{x}/{y}.png" && map.attribution == "© them" && map.leafletDir == "/opt/leaflet")
    }

    @Test func theShippedExampleConfigIsValid() throws {
        let example = URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("../../deploy/drivebus.example.yaml")
        let config = try DrivebusConfig.parse(yaml: try String(contentsOf: example, encoding: .utf8), workingDirectory: "/srv")
        #expect(config.stateDir == "/srv/var")
        #expect(config.devices.map(\.id) == ["car", "taxi-phone"])
        #expect(config.geofence.zones.map(\.id) == ["home", "gate", "parking"])
        #expect(config.costs.rentals.first?.perHourCap == 9.99)
        #expect(config.costs.ownCar.expenses.count == 1)
        #expect(config == {
            var expected = DrivebusConfig.defaults(workingDirectory: "/srv")
            expected.devices = config.devices
            expected.geofence.zones = config.geofence.zones
            expected.costs = config.costs
            return expected
        }(), "the example documents the defaults")
    }

    @Test func tokensNeverAppearInErrors() {
        let message = error("devices: [{id: a, token: hunter2-secret}, {id: b, token: hunter2-secret}]")
        #expect(message != nil)
        #expect(message?.contains("hunter2") == false)
    }

    @Test func refusesStateDirWhoseSocketsWouldBeTooLong() {
        let long = "/tmp/" + String(repeating: "d", count: 90)
        #expect(error("state_dir: \(long)")?.hasPrefix("config error: state_dir: socket path \(long)/run/") == true)
        #expect(error("state_dir: /tmp/" + String(repeating: "d", count: 80)) == nil)
    }

    @Test func findsTheFileInTheDocumentedOrder() throws {
        let dir = TempDir()
        let explicit = dir.file("explicit.yaml", "log_level: error")
        let fromEnvironment = dir.file("env.yaml", "log_level: warning")
        _ = dir.file("drivebus.yaml", "log_level: debug")

        let (first, origin) = try DrivebusConfig.load(explicitPath: explicit, environment: ["DRIVEBUS_CONFIG": fromEnvironment], workingDirectory: dir.path)
        #expect(first.logLevel == .error)
        #expect(origin == .file(explicit))
        #expect(try DrivebusConfig.load(explicitPath: nil, environment: ["DRIVEBUS_CONFIG": fromEnvironment], workingDirectory: dir.path).0.logLevel == .warning)
        #expect(try DrivebusConfig.load(explicitPath: nil, environment: [:], workingDirectory: dir.path).0.logLevel == .debug)

        let empty = TempDir()
        let (defaults, defaultOrigin) = try DrivebusConfig.load(explicitPath: nil, environment: [:], workingDirectory: empty.path)
        #expect(defaultOrigin == .builtInDefaults)
        #expect(defaults.stateDir == empty.path + "/var")

        #expect(throws: ConfigError(path: "", reason: "config file \(empty.path)/missing.yaml does not exist")) {
            try DrivebusConfig.load(explicitPath: "missing.yaml", environment: [:], workingDirectory: empty.path)
        }
    }

    @Test func preparesAPrivateRunDirectory() throws {
        let dir = TempDir()
        let layout = StateLayout(stateDir: dir.path + "/state")
        try FileManager.default.createDirectory(atPath: layout.runDir, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o777])
        try layout.prepare()
        let mode = try FileManager.default.attributesOfItem(atPath: layout.runDir)[.posixPermissions] as? Int
        #expect(mode == 0o700)
        #expect(FileManager.default.fileExists(atPath: layout.dataDir))
    }

    @Test func secondInstanceLockFailsLoudly() throws {
        let dir = TempDir()
        let layout = StateLayout(stateDir: dir.path)
        try layout.prepare()
        let first = try InstanceLock(.trips, layout: layout)
        #expect(throws: InstanceLock.AlreadyRunning.self) { try InstanceLock(.trips, layout: layout) }
        _ = try InstanceLock(.geofence, layout: layout)
        withExtendedLifetime(first) {}
    }
}
