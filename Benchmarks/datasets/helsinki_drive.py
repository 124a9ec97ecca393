# A route through the Helsinki extract by the shortest path over roads for cars (one-way
# respected), then a drive along it: 1 Hz, with the limit of the road each fix is on.
import xml.etree.ElementTree as ET, math, heapq, random, sys
# Input: the roads extract as XML: osmium cat -f osm Tests/Fixtures/osm/helsinki-roads.osm.pbf -o roads.osm
t=ET.parse(sys.argv[1] if len(sys.argv) > 1 else 'roads.osm').getroot()
nodes={n.get('id'):(float(n.get('lat')),float(n.get('lon'))) for n in t.iter('node')}
cars={'motorway','trunk','primary','secondary','tertiary','unclassified','residential','primary_link','secondary_link','tertiary_link','road','motorway_link','trunk_link'}
K=math.cos(math.radians(60.168))*111195.08
def dist(a,b): return math.hypot((b[1]-a[1])*K,(b[0]-a[0])*111195.08)
def lim(v):
    try: return float(v)
    except: return None
graph={}
for w in t.iter('way'):
    tags={x.get('k'):x.get('v') for x in w.iter('tag')}
    if tags.get('highway') not in cars or tags.get('area')=='yes': continue
    refs=[n.get('ref') for n in w.iter('nd') if n.get('ref') in nodes]
    ow=tags.get('oneway') in ('yes','true','1') or tags.get('junction')=='roundabout'
    rev=tags.get('oneway')=='-1'
    f=lim(tags.get('maxspeed:forward') or tags.get('maxspeed') or '')
    b=lim(tags.get('maxspeed:backward') or tags.get('maxspeed') or '')
    for a,c in zip(refs,refs[1:]):
        if not rev: graph.setdefault(a,[]).append((c,f,tags.get('name')))
        if not ow or rev: graph.setdefault(c,[]).append((a,b if not rev else f,tags.get('name')))
def nearest(p): return min(graph, key=lambda n: dist(nodes[n],p))
def route(src,target):
    d={src:0}; prev={}; q=[(0,src)]
    while q:
        c,u=heapq.heappop(q)
        if c>d[u]: continue
        for v,l,name in graph.get(u,[]):
            nc=c+dist(nodes[u],nodes[v])
            if nc<d.get(v,1e18): d[v]=nc; prev[v]=(u,l,name); heapq.heappush(q,(nc,v))
    dst=min(d, key=lambda n: dist(nodes[n],target))
    path=[]; u=dst
    while u!=src: p=prev[u]; path.append((p[0],u,p[1],p[2])); u=p[0]
    return path[::-1]
legs=[(60.1660,24.9500),(60.1770,24.9480),(60.1720,24.9360)]
def reach(src):
    seen={src}; st=[src]
    while st:
        u=st.pop()
        for v,_,_ in graph.get(u,[]):
            if v not in seen: seen.add(v); st.append(v)
    return len(seen)
cands=sorted(graph, key=lambda n: dist(nodes[n],(60.1720,24.9360)))[:40]
edges=[]; here=max(cands, key=reach)
for target in legs:
    leg=route(here,target); edges+=leg; here=leg[-1][1]
# Drive: 12.5 m/s (45 km/h) cruising, 6 m/s within 25 m of a turn over 40 degrees.
rnd=random.Random(16)
pts=[]  # (lat,lon,limit,bearing,turn_near)
def bearing(a,b): return math.degrees(math.atan2((b[1]-a[1])*K,(b[0]-a[0])*111195.08))%360
segs=[(nodes[u],nodes[v],l,n) for u,v,l,n in edges if dist(nodes[u],nodes[v])>0.01]
turns=[]
for i in range(1,len(segs)):
    d=abs(bearing(*segs[i-1][:2])-bearing(*segs[i][:2]))%360; d=min(d,360-d)
    turns.append(d)
cum=[0]
for s in segs: cum.append(cum[-1]+dist(s[0],s[1]))
turnpos=[cum[i] for i in range(1,len(segs)) if turns[i-1]>40]
total=cum[-1]
out=[]; s=0.0; tsec=0; k=0; speed=12.5
while s<total:
    while k+1<len(segs) and cum[k+1]<=s: k+=1
    a,b,l,n=segs[k]; L=dist(a,b); f=(s-cum[k])/L if L>0 else 0
    lat=a[0]+(b[0]-a[0])*f; lon=a[1]+(b[1]-a[1])*f
    # GPS noise, 4 m sigma
    lat+=rnd.gauss(0,4)/111195.08; lon+=rnd.gauss(0,4)/K
    near=min([abs(s-p) for p in turnpos]+[1e9])
    target=6.0 if near<25 else 12.5
    speed+=max(min(target-speed,1.5),-2.0)
    out.append((tsec,round(lat,7),round(lon,7),round(speed,2),round(bearing(a,b),1),l,n))
    s+=speed; tsec+=1
print("seconds,lat,lon,speed_mps,course_deg,limit_kmh,street")
for r in out: print(",".join("" if v is None else str(v) for v in r))
print(f"# {len(out)} fixes, {total:.0f} m, {len(segs)} segments", file=sys.stderr)
