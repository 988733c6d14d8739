import numpy as np, psycopg
from normrank import PgVectorNormIndex
dsn = open("/tmp/hunt-ops/dsn.txt").read().strip()
rng = np.random.default_rng(5); V = (rng.normal(size=(30, 8)) * rng.uniform(0.5, 2, (30, 1))).astype(np.float32)
admin = psycopg.connect(dsn, autocommit=True)
for alter in ["ALTER TABLE alt DROP COLUMN metadata", "ALTER TABLE alt RENAME TO alt_old", "DROP TABLE alt_normrank",
              "UPDATE alt_normrank SET value = jsonb_set(value, '{weights,a}', '\"x\"')", "TRUNCATE alt"]:
    admin.execute("drop table if exists alt, alt_old, alt_normrank")
    A = PgVectorNormIndex(dsn, "alt"); A.add_vectors(V, rng.integers(5, 50, 30), ids=[f"d{i}" for i in range(30)])
    admin.execute(alter)
    for what, f in (("search", lambda: len(A.search(V[0], k=3))), ("len", lambda: len(A)),
                    ("add", lambda: A.add_vectors(V[:1], [7], ids=["new"]))):
        try: r = f(); print(f"{alter[:40]:42s} {what}: ok {r}")
        except Exception as e: print(f"{alter[:40]:42s} {what}: {type(e).__name__}: {str(e)[:140]}")
    A.close()
admin.execute("drop table if exists alt, alt_old, alt_normrank")
