import DrivebusConfiguration
import DrivebusKit
import DrivebusSchema
import Foundation
import MQTTCore
import Testing

@Suite struct MQTTCoreTests {
    // MARK: OwnTracks topics

    func ownTracks(devices: [String: String] = [:], maxPayloadBytes: Int = 64 * 1024) -> MQTTConfiguration {
        var configuration = MQTTConfiguration()
        configuration.ownTracks.devices = devices
        configuration.maxPayloadBytes = maxPayloadBytes
        return configuration
    }

    /// `"<code> <field>"` of a refusal, nil for a routed message.
    func refusal(_ result: Result<OwnTracksTopics.Routed, OwnTracksTopics.Refusal>) -> String? {
        guard case .failure(let refusal) = result else { return nil }
        return "\(refusal.code) \(refusal.field)"
    }

    @Test func filtersCoverLocationsAndEventsUnderTheBaseTopic() {
        var configuration = MQTTConfiguration()
        #expect(OwnTracksTopics.filters(configuration) == ["owntracks/+/+", "owntracks/+/+/event"])
        configuration.ownTracks.baseTopic = "home/ot"
        #expect(OwnTracksTopics.filters(configuration) == ["home/ot/+/+", "home/ot/+/+/event"])
    }

    @Test(arguments: [
        ("owntracks/jan/phone", "owntracks", "jan/phone"),
        ("owntracks/jan/phone/event", "owntracks", "jan/phone"),
        ("home/ot/jan/phone", "home/ot", "jan/phone"),
        ("home/ot/jan/phone/event", "home/ot", "jan/phone"),
        ("owntracks/jan", "owntracks", nil),
        ("owntracks/jan/phone/cmd", "owntracks", nil),
        ("owntracks/jan/phone/event/x", "owntracks", nil),
        ("owntracks//phone", "owntracks", nil),
        ("owntracks/jan/", "owntracks", nil),
        ("other/jan/phone", "owntracks", nil),
        ("owntracksx/jan/phone", "owntracks", nil),
        ("owntracks/jan/phone", "home/ot", nil),
    ] as [(String, String, String?)])
    func userDeviceOfATopic(topic: String, baseTopic: String, expected: String?) {
        #expect(OwnTracksTopics.userDevice(topic, baseTopic: baseTopic) == expected)
    }

    @Test func routeByTheConfiguredMapOrElseTheDevicePart() {
        let known: Set<String> = ["car", "bike"]
        let mapped = ownTracks(devices: ["jan/bike": "car"])
        #expect(OwnTracksTopics.route(topic: "owntracks/jan/bike", payload: Array("{}".utf8), configuration: mapped, knownDevices: known)
            == .success(.init(device: "car", payload: "{}")))
        // With a map, a topic it does not list is refused: eva must not post as the bike, nor as the car.
        #expect(refusal(OwnTracksTopics.route(topic: "owntracks/eva/bike/event", payload: Array("{}".utf8), configuration: mapped, knownDevices: known))
            == "mqtt.unlisted_topic topic")
        #expect(refusal(OwnTracksTopics.route(topic: "owntracks/eva/car", payload: Array("{}".utf8), configuration: mapped, knownDevices: known))
            == "mqtt.unlisted_topic topic")
        // Without one, the device part names the device.
        #expect(OwnTracksTopics.route(topic: "owntracks/eva/bike/event", payload: Array("{}".utf8), configuration: ownTracks(devices: [:]), knownDevices: known)
            == .success(.init(device: "bike", payload: "{}")))
    }

    @Test func routeRefusesUnknownDevicesTopicsLargeAndNonUTF8Payloads() {
        let configuration = ownTracks(devices: ["jan/phone": "car"], maxPayloadBytes: 16)
        let known: Set<String> = ["car"]
        func route(_ topic: String, _ payload: [UInt8]) -> Result<OwnTracksTopics.Routed, OwnTracksTopics.Refusal> {
            OwnTracksTopics.route(topic: topic, payload: payload, configuration: configuration, knownDevices: known)
        }
        #expect(refusal(route("owntracks/eva/scooter", Array("{}".utf8))) == "mqtt.unlisted_topic topic")
        #expect(refusal(OwnTracksTopics.route(topic: "owntracks/eva/scooter", payload: Array("{}".utf8), configuration: ownTracks(devices: [:]), knownDevices: known))
            == "mqtt.unknown_device topic")
        #expect(refusal(route("other/jan/phone", Array("{}".utf8))) == "mqtt.unknown_topic topic")
        #expect(refusal(route("owntracks/jan/phone/cmd", Array("{}".utf8))) == "mqtt.unknown_topic topic")
        #expect(refusal(route("owntracks/jan/phone", Array(repeating: UInt8(ascii: "x"), count: 17))) == "mqtt.too_large payload")
        #expect(refusal(route("owntracks/jan/phone", Array(repeating: UInt8(ascii: "x"), count: 16))) == nil)
        #expect(refusal(route("owntracks/jan/phone", [0x7B, 0xFF, 0xFE, 0x7D])) == "mqtt.not_utf8 payload")
    }

    // MARK: Home Assistant discovery

    let bridge = HomeAssistantBridge(configuration: MQTTConfiguration(), zones: ["home", "work"])

    func object(_ text: String) throws -> [String: Any] {
        try #require(try JSONSerialization.jsonObject(with: Data(text.utf8)) as? [String: Any])
    }

    @Test func discoveryTopicsForADeviceWithAndWithoutAHome() {
        let common = [
            "device_tracker/drivebus_car/location", "sensor/drivebus_car/battery", "binary_sensor/drivebus_car/trip",
            "sensor/drivebus_car/last_trip_distance", "sensor/drivebus_car/last_trip_duration", "sensor/drivebus_car/last_trip_score",
            "sensor/drivebus_car/today_distance", "event/drivebus_car/gate", "event/drivebus_car/checkout",
        ]
        let zones = ["binary_sensor/drivebus_car/zone_home", "binary_sensor/drivebus_car/zone_work"]
        let withHome = bridge.discovery([.init(id: "car", home: "home")])
        #expect(withHome.map(\.topic) == (common + ["sensor/drivebus_car/today_away"] + zones).map { "homeassistant/\($0)/config" })
        let withoutHome = bridge.discovery([.init(id: "car")])
        #expect(withoutHome.map(\.topic) == (common + zones).map { "homeassistant/\($0)/config" })
        #expect(withHome.allSatisfy { $0.qos == 1 && $0.retain })
    }

    @Test func discoveryPayloadsNameTheEntityItsDeviceAndAvailability() throws {
        let publications = bridge.discovery([.init(id: "car", home: "home"), .init(id: "bike")])
        #expect(Set(publications.map(\.topic)).count == publications.count)
        var uniqueIDs: Set<String> = []
        for publication in publications {
            let config = try object(publication.payload)
            let device = try #require(config["device"] as? [String: Any])
            let id = publication.topic.contains("drivebus_car/") ? "car" : "bike"
            let objectID = publication.topic.split(separator: "/")[3]
            #expect(config["unique_id"] as? String == "drivebus_\(id)_\(objectID)")
            #expect(config["availability_topic"] as? String == "drivebus/status")
            #expect(device["identifiers"] as? [String] == ["drivebus_\(id)"])
            uniqueIDs.insert(config["unique_id"] as? String ?? "")
        }
        #expect(uniqueIDs.count == publications.count)
        let trip = try #require(publications.first { $0.topic == "homeassistant/binary_sensor/drivebus_car/trip/config" })
        #expect(trip.payload == #"{"availability_topic":"drivebus/status","device":{"identifiers":["drivebus_car"],"manufacturer":"drivebus","#
            + #""name":"car"},"device_class":"moving","name":"Trip in progress","origin":{"name":"drivebus"},"#
            + #""state_topic":"drivebus/car/trip","unique_id":"drivebus_car_trip"}"#)
    }

    @Test func noDiscoveryWhenHomeAssistantIsOff() {
        var configuration = MQTTConfiguration()
        configuration.homeAssistant = nil
        #expect(HomeAssistantBridge(configuration: configuration, zones: ["home"]).discovery([.init(id: "car", home: "home")]).isEmpty)
    }

    @Test func removalsEmptyOnlyTheTopicsNoLongerPublished() {
        let before = bridge.discovery([.init(id: "car", home: "home"), .init(id: "bike")])
        let after = HomeAssistantBridge(configuration: MQTTConfiguration(), zones: ["home"]).discovery([.init(id: "car")])
        let removals = HomeAssistantBridge.removals(previous: Set(before.map(\.topic)), current: after)
        let gone = Set(before.map(\.topic)).subtracting(after.map(\.topic)).sorted()
        #expect(removals.map(\.topic) == gone)
        #expect(removals.contains { $0.topic == "homeassistant/sensor/drivebus_car/today_away/config" })
        #expect(removals.contains { $0.topic == "homeassistant/binary_sensor/drivebus_car/zone_work/config" })
        #expect(!removals.contains { $0.topic == "homeassistant/binary_sensor/drivebus_car/zone_home/config" })
        #expect(removals.allSatisfy { $0.payload.isEmpty && $0.qos == 1 && $0.retain })
        #expect(HomeAssistantBridge.removals(previous: Set(after.map(\.topic)), current: after).isEmpty)
    }

    // MARK: States and events

    func publications(_ busTopic: String, _ payload: String) -> [Publication] {
        bridge.publications(busTopic: busTopic, payload: Array(payload.utf8))
    }

    @Test func fixPublishesLocationAndBatteryRetainedAtQoS0() {
        let fix = #"{"lat":48.2,"lon":16.37,"accuracy_m":5,"altitude_m":180,"speed_mps":10,"course_deg":90,"time":"2025-05-01T08:00:00Z","battery":0.87}"#
        #expect(publications("fix.car", fix) == [
            Publication("drivebus/car/location",
                #"{"altitude":180,"course":90,"gps_accuracy":5,"latitude":48.2,"longitude":16.37,"speed_kmh":36,"time":"2025-05-01T08:00:00Z"}"#,
                qos: 0, retain: true),
            Publication("drivebus/car/battery", "87", qos: 0, retain: true),
        ])
        #expect(publications("fix.car", #"{"lat":48.2,"lon":16.37}"#) == [
            Publication("drivebus/car/location", #"{"latitude":48.2,"longitude":16.37}"#, qos: 0, retain: true),
        ])
        #expect(publications("fix.car", #"{"lat":48.2,"lon":16.37,"battery":-1}"#).map(\.topic) == ["drivebus/car/location"])
        #expect(publications("fix.car", #"{"lon":16.37}"#).isEmpty)
    }

    @Test func zoneIDsThatATopicCannotTakeAreSanitised() {
        #expect(HomeAssistantBridge.topicLevel("work+1 #2/b") == "work_1__2_b")
        #expect(HomeAssistantBridge.topicLevel("home-2_x") == "home-2_x")
        let odd = HomeAssistantBridge(configuration: MQTTConfiguration(), zones: ["my home"])
        #expect(odd.discovery([.init(id: "car")]).contains { $0.topic == "homeassistant/binary_sensor/drivebus_car/zone_my_home/config" })
        #expect(odd.publications(busTopic: "geofence.enter.car", payload: Array(#"{"zone":"my home"}"#.utf8)).first?.topic == "drivebus/car/zone/my_home")
    }

    @Test func aGroupOfEventsPublishesOnlyEachDevicesLastPosition() {
        let group: [(busTopic: String, payload: [UInt8])] = [
            ("fix.car", Array(#"{"lat":48.1,"lon":16.1}"#.utf8)),
            ("fix.bike", Array(#"{"lat":47.1,"lon":15.1}"#.utf8)),
            ("trip.started.car", Array(#"{"trip_id":"t1"}"#.utf8)),
            ("fix.car", Array(#"{"lat":48.2,"lon":16.2}"#.utf8)),
        ]
        #expect(bridge.publications(group).map(\.description) == [
            #"drivebus/bike/location (retained) {"latitude":47.1,"longitude":15.1}"#,
            "drivebus/car/trip (retained) ON",
            #"drivebus/events/trip/started/car {"trip_id":"t1"}"#,
            #"drivebus/car/location (retained) {"latitude":48.2,"longitude":16.2}"#,
        ])
    }

    /// Positions reach the bridge in ingest's journal pages: a page gives its live fixes in
    /// order, not its other records and not imported history; a page that cannot be read gives
    /// nothing and is counted; a page from another source than ingest gives nothing.
    @Test func journalPagesGiveTheirLiveFixesAndNothingElse() throws {
        let start = Date(timeIntervalSince1970: 1_746_086_400)
        func fix(_ seq: UInt64, _ device: String, _ source: FixSource) -> [UInt8] {
            BusJSON.encode(Fix(seq: seq, device: device, time: start.addingTimeInterval(Double(seq)), lat: 48.1, lon: 16.1, source: source))
        }
        var page = JournalPage.Builder()
        page.append(seq: 7, topic: "fix.car", payload: fix(7, "car", .overland))
        page.append(seq: 8, topic: "motion.car", payload: Array(#"{"seq":8,"activity":"walking"}"#.utf8))
        page.append(seq: 9, topic: "fix.bike", payload: fix(9, "bike", .owntracks))
        page.append(seq: 10, topic: "fix.car", payload: fix(10, "car", .import))
        let taken = page.take()
        let (firstSeq, bytes) = try #require(taken)
        #expect(firstSeq == 7)
        func message(_ payload: [UInt8], source: String = "ingest") -> BusMessage {
            BusMessage(topic: JournalPage.type, header: EnvelopeHeader(type: JournalPage.type, source: source, seq: 1, epoch: "e", time: start), payload: payload)
        }
        let (fixes, unreadable) = HomeAssistantBridge.liveFixes(inPages: [message(bytes), message(Array("not a page".utf8)), message(bytes, source: "trips")])
        #expect(fixes.map(\.busTopic) == ["fix.car", "fix.bike"])
        #expect(fixes.map(\.payload) == [fix(7, "car", .overland), fix(9, "bike", .owntracks)])
        #expect(unreadable == 1)
        #expect(!HomeAssistantBridge.eventPrefixes.contains { "fix.car".hasPrefix($0) })
    }

    @Test func tripStartAndEndSetTheTripStateAndLastTrip() {
        let ended = #"{"trip_id":"t1","distance_m":12345.6,"duration_s":900,"start_time":"2025-05-01T08:00:00Z","end_time":"2025-05-01T08:15:00Z"}"#
        #expect(publications("trip.started.car", #"{"trip_id":"t1"}"#) == [
            Publication("drivebus/car/trip", "ON", qos: 1, retain: true),
            Publication("drivebus/events/trip/started/car", #"{"trip_id":"t1"}"#, qos: 1, retain: false),
        ])
        #expect(publications("trip.ended.car", ended) == [
            Publication("drivebus/car/trip", "OFF", qos: 1, retain: true),
            Publication("drivebus/car/last_trip",
                #"{"distance_km":12.35,"duration_s":900,"end_time":"2025-05-01T08:15:00Z","start_time":"2025-05-01T08:00:00Z","trip_id":"t1"}"#,
                qos: 1, retain: true),
            Publication("drivebus/events/trip/ended/car", ended, qos: 1, retain: false),
        ])
    }

    @Test func scoreAndZoneStates() {
        let scored = #"{"trip_id":"t1","score":87.5,"events_per_100km":2.5,"speeding_s":30,"end_time":"e","harsh":[]}"#
        #expect(publications("drive.scored.car", scored) == [
            Publication("drivebus/car/last_score", #"{"end_time":"e","events_per_100km":2.5,"score":87.5,"speeding_s":30,"trip_id":"t1"}"#,
                qos: 1, retain: true),
            Publication("drivebus/events/drive/scored/car", scored, qos: 1, retain: false),
        ])
        #expect(publications("geofence.enter.car", #"{"zone":"home"}"#) == [
            Publication("drivebus/car/zone/home", "ON", qos: 1, retain: true),
            Publication("drivebus/events/geofence/enter/car", #"{"zone":"home"}"#, qos: 1, retain: false),
        ])
        #expect(publications("geofence.exit.car", #"{"zone":"work"}"#).first == Publication("drivebus/car/zone/work", "OFF", qos: 1, retain: true))
        // A crossing in an imported history: copied as an event, but the zone's state stays.
        #expect(publications("geofence.exit.car", #"{"zone":"home","imported":true}"#) == [
            Publication("drivebus/events/geofence/exit/car", #"{"zone":"home","imported":true}"#, qos: 1, retain: false),
        ])
        #expect(publications("geofence.exit.car", #"{"zone":"home","imported":false}"#).count == 2)
        // So is a trip or a score of one: `trip`, `last_trip` and `last_score` stay.
        for (topic, payload) in [
            ("trip.started.car", #"{"trip_id":"car-1","imported":true}"#), ("trip.ended.car", #"{"trip_id":"car-1","imported":true}"#),
            ("drive.scored.car", #"{"trip_id":"car-1","score":80,"imported":true}"#),
        ] {
            #expect(publications(topic, payload).map(\.topic) == ["drivebus/events/" + topic.replacingOccurrences(of: ".", with: "/")])
        }
    }

    @Test func gateAndCheckoutAreEventsNotRetained() {
        let fired = #"{"gate":"garage","zone":"home","status":200,"attempts":1,"time":"t"}"#
        #expect(publications("gate.fired.car", fired) == [
            Publication("drivebus/car/gate", #"{"attempts":1,"event_type":"fired","gate":"garage","status":200,"time":"t","zone":"home"}"#,
                qos: 1, retain: false),
            Publication("drivebus/events/gate/fired/car", fired, qos: 1, retain: false),
        ])
        #expect(publications("gate.failed.car", #"{"gate":"garage","error":"timeout"}"#).first
            == Publication("drivebus/car/gate", #"{"error":"timeout","event_type":"failed","gate":"garage"}"#, qos: 1, retain: false))
        let checkout = #"{"checkout_time":"t","reason":"walking","confidence":0.9,"ride_s":600,"ride_distance_m":4200}"#
        #expect(publications("taxi.checkout.car", checkout) == [
            Publication("drivebus/car/checkout",
                #"{"checkout_time":"t","confidence":0.9,"event_type":"checkout","reason":"walking","ride_distance_m":4200,"ride_s":600}"#,
                qos: 1, retain: false),
            Publication("drivebus/events/taxi/checkout/car", checkout, qos: 1, retain: false),
        ])
    }

    @Test func otherEventsAreOnlyMirroredAndNonJSONYieldsNothing() {
        #expect(publications("device.seen.car", #"{"time": "t"}"#) == [
            Publication("drivebus/events/device/seen/car", #"{"time": "t"}"#, qos: 1, retain: false),
        ])
        #expect(publications("trip.started.car", "not json").isEmpty)
        #expect(publications("trip.started.car", "[1]").isEmpty)
        #expect(publications("car", "{}").isEmpty)
    }

    @Test func changesTodayOnlyForTripEndsAndZoneTransitions() {
        #expect(HomeAssistantBridge.changesToday(busTopic: "trip.ended.car"))
        #expect(HomeAssistantBridge.changesToday(busTopic: "geofence.enter.car"))
        #expect(HomeAssistantBridge.changesToday(busTopic: "geofence.exit.car"))
        #expect(!HomeAssistantBridge.changesToday(busTopic: "trip.started.car"))
        #expect(!HomeAssistantBridge.changesToday(busTopic: "fix.car"))
    }

    @Test func todayWithAndWithoutTimeAway() {
        #expect(bridge.today(device: "car", date: "2025-05-01", distanceM: 12345.6, awayS: 3600.4)
            == Publication("drivebus/car/today", #"{"away_s":3600,"date":"2025-05-01","distance_km":12.35}"#, qos: 1, retain: true))
        #expect(bridge.today(device: "car", date: "2025-05-01", distanceM: 0, awayS: nil)
            == Publication("drivebus/car/today", #"{"date":"2025-05-01","distance_km":0}"#, qos: 1, retain: true))
    }

    // MARK: The mqtt: config section

    func parse(_ yaml: String, environment: [String: String] = [:]) throws -> DrivebusConfig {
        try DrivebusConfig.parse(yaml: yaml, workingDirectory: "/srv", environment: environment)
    }

    func errorPath(_ yaml: String, environment: [String: String] = [:]) -> String? {
        do {
            _ = try DrivebusConfig.parse(yaml: yaml, workingDirectory: "/srv", environment: environment)
            return nil
        } catch {
            return error.path
        }
    }

    @Test func noMQTTSectionMeansNoMQTTService() throws {
        let config = try parse("log_level: info")
        #expect(config.mqtt == nil)
        #expect(!config.services.contains(.mqtt))
    }

    @Test func fullSectionParses() throws {
        let config = try parse("""
            mqtt:
              broker: "broker.lan:1884"
              client_id: drivebus-test
              username: drivebus
              password: "hunter2-secret"
              owntracks:
                base_topic: home/ot
                devices: {"jan/phone": car}
              home_assistant: false
              topic_prefix: db
            """)
        let mqtt = try #require(config.mqtt)
        #expect(mqtt.host == "broker.lan")
        #expect(mqtt.port == 1884)
        #expect(mqtt.clientID == "drivebus-test")
        #expect(mqtt.username == "drivebus")
        #expect(mqtt.password == "hunter2-secret")
        #expect(mqtt.tls == nil)
        #expect(mqtt.ownTracks.baseTopic == "home/ot")
        #expect(mqtt.ownTracks.devices == ["jan/phone": "car"])
        #expect(mqtt.homeAssistant == nil)
        #expect(mqtt.topicPrefix == "db")
        #expect(mqtt.availabilityTopic == "db/status")
        #expect(config.services.last == .mqtt)
        #expect(config.services.filter { $0 == .mqtt }.count == 1)
        let description = String(describing: mqtt)
        #expect(!description.contains("hunter2"))
        #expect(description.contains("drivebus@broker.lan:1884"))
    }

    @Test func defaultPortFollowsTLS() throws {
        let plain = try #require(try parse("mqtt: {}").mqtt)
        #expect(plain.host == "127.0.0.1")
        #expect(plain.port == 1883)
        #expect(plain.homeAssistant == MQTTConfiguration.HomeAssistant())
        let tls = try #require(try parse("mqtt: {tls: true}").mqtt)
        #expect(tls.port == 8883)
        #expect(tls.tls == MQTTConfiguration.TLS())
    }

    @Test func passwordFromEnvironmentAndFile() throws {
        let fromEnvironment = try parse("mqtt: {username: u, password_env: MQTT_PASSWORD}", environment: ["MQTT_PASSWORD": "env-secret"])
        #expect(fromEnvironment.mqtt?.password == "env-secret")
        let file = FileManager.default.temporaryDirectory.appendingPathComponent("mqtt-password-\(UUID().uuidString)").path
        try "file-secret\nsecond line\n".write(toFile: file, atomically: true, encoding: .utf8)
        defer { try? FileManager.default.removeItem(atPath: file) }
        let fromFile = try parse("mqtt: {username: u, password_file: \"\(file)\"}")
        #expect(fromFile.mqtt?.password == "file-secret")
        #expect(!String(describing: fromFile.mqtt!).contains("file-secret"))
    }

    @Test(arguments: [
        ("mqtt: {username: u, password: p, password_env: X}", "mqtt.password_env"),
        ("mqtt: {username: u, password: p, password_file: /nonexistent}", "mqtt.password_file"),
        ("mqtt: {password: p}", "mqtt.username"),
        ("mqtt: {owntracks: {base_topic: \"owntracks/#\"}}", "mqtt.owntracks.base_topic"),
        ("mqtt: {owntracks: {base_topic: \"owntracks/+\"}}", "mqtt.owntracks.base_topic"),
        ("mqtt: {owntracks: {devices: {jan: car}}}", "mqtt.owntracks.devices"),
        ("mqtt: {owntracks: {devices: {\"jan/phone/x\": car}}}", "mqtt.owntracks.devices"),
        ("mqtt: {username: u, password_env: MISSING}", "mqtt.password_env"),
        ("mqtt: {topic_prefix: \"a//b\"}", "mqtt.topic_prefix"),
    ])
    func errorsNameTheField(yaml: String, path: String) {
        #expect(errorPath(yaml, environment: ["X": "x"]) == path)
    }
}
