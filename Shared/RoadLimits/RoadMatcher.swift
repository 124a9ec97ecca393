import Foundation

/// Follows one drive along the roads of an index, fix by fix, well enough to know the limit in
/// force: each fix is matched to the nearby road that best fits its position (against its
/// accuracy), its direction of travel and its speed, and the drive stays on its road until another one has
/// fitted better for `switchAfter` fixes in a row, or its road is out of reach. So a motorway
/// beside a 30 km/h service road keeps the motorway's limit when GPS noise drifts a fix or two
/// towards the service road. The value is the state (`Codable`, for checkpoints).
public struct RoadMatcher: Sendable, Codable, Equatable {
    public struct Configuration: Sendable, Equatable {
        /// A fix without an accuracy counts as this, metres.
        public var defaultAccuracyM = 10.0
        /// No road farther than this from a fix is considered, metres.
        public var maxDistanceM = 50.0
        /// Fixes in a row a better road must win before the drive moves to it.
        public var switchAfter = 3

        public init() {}
    }

    public struct Match: Sendable, Equatable {
        public var way: Int
        public var roadClass: RoadClass
        /// The posted limit in the direction of travel; nil when the road has none tagged.
        public var limit: PostedLimit?
        public var distanceM: Double
    }

    /// Road numbers mean something only in the index they came from (its checksum).
    private var indexChecksum: UInt32 = 0
    private var current = -1
    private var challenger = -1
    private var challengerWins = 0

    public init() {}

    /// The road a fix is on, or nil when no road is within reach (a car park, an unmapped lane).
    /// `headingDeg` is the direction of travel when the car moves fast enough to have one.
    public mutating func match(
        lat: Double, lon: Double, accuracyM: Double?, headingDeg: Double?, speedMps: Double? = nil, in index: RoadLimitIndex,
        _ configuration: Configuration = Configuration()
    ) -> Match? {
        if indexChecksum != index.summary.checksum {
            self = RoadMatcher()
            indexChecksum = index.summary.checksum
        }
        let sigma = min(max(accuracyM ?? configuration.defaultAccuracyM, 5), 25)
        let radius = min(3 * sigma + 5, configuration.maxDistanceM)
        let heading = headingDeg

        // The best-fitting segment of each road in reach: position against the fix's accuracy,
        // direction against the road's (either way on a two-way road; against a one-way road's
        // direction is as bad as across it), a little against minor roads, and speed against
        // the limit: 45 km/h on a 10 km/h service lane beside a street is the street. Only far
        // beyond the limit (1.5 × + 5 km/h) does it count, so real speeding stays on its road.
        var candidates: [(way: Int, cost: Double, hit: RoadLimitIndex.Hit)] = []
        index.forEachSegment(nearLat: lat, lon: lon, radiusM: radius) { hit in
            let road = index.way(hit.way)
            var cost = (hit.distanceM / sigma) * (hit.distanceM / sigma)
            if let heading {
                var difference = Self.angle(heading, hit.bearing)
                if !road.oneway { difference = min(difference, 180 - difference) }
                cost += min((difference / 30) * (difference / 30), 9)
            }
            if road.roadClass.isMinor { cost += 1 }
            if let speed = speedMps, let limit = road.forward?.kmh ?? road.backward?.kmh {
                let beyond = (speed * 3.6 - limit * 1.5 - 5) / 10
                if beyond > 0 { cost += min(beyond * beyond, 4) }
            }
            if let k = candidates.firstIndex(where: { $0.way == hit.way }) {
                if cost < candidates[k].cost { candidates[k] = (hit.way, cost, hit) }
            } else {
                candidates.append((hit.way, cost, hit))
            }
        }
        guard let best = candidates.min(by: { $0.cost < $1.cost }) else {
            current = -1
            challenger = -1
            challengerWins = 0
            return nil
        }
        var chosen = best
        if best.way == current {
            // The drive's road fits best: any challenger's run is broken.
            challenger = -1
            challengerWins = 0
        } else if let kept = candidates.first(where: { $0.way == current }) {
            // The drive's road is still in reach: keep it unless another fits clearly better, fix
            // after fix.
            if kept.cost <= best.cost + 3 {
                challengerWins = 0
                chosen = kept
            } else {
                challengerWins = challenger == best.way ? challengerWins + 1 : 1
                challenger = best.way
                // A road that meets the drive's road is where a turn goes: one clear win moves
                // the drive there. One that does not meet it must win fix after fix.
                let needed = index.meet(current, best.way) ? 1 : configuration.switchAfter
                if challengerWins < needed { chosen = kept }
            }
        }
        if chosen.way != current {
            current = chosen.way
            challenger = -1
            challengerWins = 0
        }
        let road = index.way(chosen.way)
        let limit: PostedLimit?
        if road.oneway || road.forward == road.backward {
            limit = road.forward
        } else if let heading {
            limit = Self.angle(heading, chosen.hit.bearing) <= 90 ? road.forward : road.backward
        } else {
            // No direction (too slow to have one): the higher limit, so nobody is accused.
            limit = [road.forward, road.backward].compactMap { $0 }.max { ($0.kmh ?? .infinity) < ($1.kmh ?? .infinity) }
        }
        return Match(way: chosen.way, roadClass: road.roadClass, limit: limit, distanceM: chosen.hit.distanceM)
    }

    /// The angle between two directions, 0…180 degrees.
    static func angle(_ a: Double, _ b: Double) -> Double {
        let difference = abs(a - b).truncatingRemainder(dividingBy: 360)
        return difference > 180 ? 360 - difference : difference
    }
}
