import DrivebusGeo
import DrivebusTestSupport
import Foundation
import Testing

@Suite struct GeoTests {
    @Test func haversineMatchesKnownDistances() {
        // One degree of latitude on the mean sphere.
        #expect(abs(Geo.distance(Coordinate(lat: 0, lon: 0), Coordinate(lat: 1, lon: 0)) - 111_195.08) < 0.01)
        // Across the antimeridian, the short way round.
        #expect(abs(Geo.distance(Coordinate(lat: 0, lon: 179.999), Coordinate(lat: 0, lon: -179.999)) - 222.39) < 0.01)
        #expect(Geo.bearing(from: Coordinate(lat: 0, lon: 0), to: Coordinate(lat: 1, lon: 0)) == 0)
        #expect(abs(Geo.bearing(from: Coordinate(lat: 0, lon: 0), to: Coordinate(lat: 0, lon: 1)) - 90) < 1e-9)
    }

    @Test func projectionIsContinuousAcrossTheAntimeridian() {
        let projection = LocalProjection(origin: Coordinate(lat: -17, lon: 179.9))
        let east = projection.project(Coordinate(lat: -17, lon: -179.9))
        #expect(abs(east.x - 0.2 * 111_195.08 * cos(17 * Double.pi / 180)) < 0.5)
        let back = projection.unproject(x: east.x, y: east.y)
        #expect(abs(back.lon - -179.9) < 1e-9 && abs(back.lat - -17) < 1e-9)
    }

    @Test func douglasPeuckerKeepsCornersAndDropsNoise() {
        // An L: east 1 km, then north 1 km, with ±1 m wobble every 10 m.
        var points: [Coordinate] = []
        let projection = LocalProjection(origin: Coordinate(lat: 48, lon: 16))
        for step in 0...100 { points.append(projection.unproject(x: Double(step) * 10, y: step % 2 == 0 ? 1 : -1)) }
        for step in 1...100 { points.append(projection.unproject(x: 1000 + (step % 2 == 0 ? 1 : -1), y: Double(step) * 10)) }
        let kept = DouglasPeucker.simplify(points, epsilonM: 5)
        #expect(kept == [0, 100, 200])
        #expect(DouglasPeucker.simplify(points, epsilonM: 0.5).count > 150)
        #expect(DouglasPeucker.simplify(Array(points.prefix(2)), epsilonM: 5) == [0, 1])
    }

    @Test func polygonContainmentNearTheAntimeridian() {
        // A square straddling 180°, about 2.2 km a side, in Fiji.
        let square = GeoPolygon([
            Coordinate(lat: -16.99, lon: 179.99), Coordinate(lat: -16.99, lon: -179.99),
            Coordinate(lat: -17.01, lon: -179.99), Coordinate(lat: -17.01, lon: 179.99),
        ])
        #expect(square.contains(Coordinate(lat: -17, lon: 180)))
        #expect(square.contains(Coordinate(lat: -17, lon: -179.995)))
        #expect(square.contains(Coordinate(lat: -17, lon: 179.995)))
        #expect(!square.contains(Coordinate(lat: -17, lon: 179.98)))
        #expect(!square.contains(Coordinate(lat: -17, lon: 0)))
        // The east and west edges are nearer: 0.01° of longitude at 17° S.
        #expect(abs(square.distanceToBoundary(Coordinate(lat: -17, lon: 180)) - 1111.95 * cos(17 * Double.pi / 180)) < 1)
        #expect(abs(square.inradiusM - 1062) < 60)
    }

    @Test func ascentIgnoresNoiseBelowTheHysteresis() {
        var counter = AscentCounter(hysteresisM: 5)
        for altitude in [100.0, 102, 99, 101, 98, 102, 100] { counter.add(altitude) }
        #expect(counter.ascentM == 0 && counter.descentM == 0)
        for altitude in stride(from: 100.0, through: 150, by: 1) { counter.add(altitude) }
        for altitude in stride(from: 150.0, through: 120, by: -2) { counter.add(altitude) }
        #expect(counter.ascentM == 50)
        #expect(counter.descentM == 30)
    }
}
