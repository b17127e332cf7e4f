"""Is a compare-and-set update atomic on this Mongo server?  Threads race one ``update_one``
whose filter names the version they all read; on a server that updates one document
atomically exactly one matches.

    python benchmarks/compare_and_set.py mongodb://127.0.0.1:27017 4 200   # url, threads, trials

It prints the trials in which more than one update matched.  The Mongo reference builds on
this (docs/mongo.md); FerretDB v1.24.2 fails it (benchmarks/ferretdb.sh).
"""
import sys
import threading

import pymongo

url = sys.argv[1]
threads, trials = int(sys.argv[2]), int(sys.argv[3])
clients = [pymongo.MongoClient(url) for _ in range(threads)]  # one connection per thread
collection = clients[0].harel_bench_cas.docs
collection.drop()
doubled = 0
for trial in range(trials):
    collection.insert_one({"_id": trial, "version": 0})
    start_line = threading.Barrier(threads)
    winners = []

    def race(index: int) -> None:
        start_line.wait()
        result = clients[index].harel_bench_cas.docs.update_one(
            {"_id": trial, "version": 0}, {"$set": {"holder": index}, "$inc": {"version": 1}})
        if result.matched_count == 1:
            winners.append(index)

    racers = [threading.Thread(target=race, args=(index,)) for index in range(threads)]
    for racer in racers:
        racer.start()
    for racer in racers:
        racer.join()
    doubled += len(winners) > 1
last = collection.find_one({"_id": trials - 1})
collection.database.client.drop_database("harel_bench_cas")
for client in clients:
    client.close()
print(f"{url}: {threads} threads, {trials} trials: more than one update matched in {doubled}; "
      f"the last document after the race: {last}")
