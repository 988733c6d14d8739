from haystack import Document, Pipeline
from haystack.components.retrievers.in_memory import InMemoryBM25Retriever
from haystack.document_stores.in_memory import InMemoryDocumentStore
from haystack_integrations.components.rankers.normrank import NormRankRanker

texts = [
    "The Eiffel Tower is a wrought-iron lattice tower in Paris.",
    "Photosynthesis turns light, water and carbon dioxide into sugar in green plants.",
    "The Great Wall of China stretches across northern China.",
    "Mitochondria produce most of the chemical energy a cell needs.",
]
store = InMemoryDocumentStore()
store.write_documents([Document(content=t) for t in texts])
pipe = Pipeline()
pipe.add_component("bm25", InMemoryBM25Retriever(store, top_k=4))
pipe.add_component("rerank", NormRankRanker(top_k=2, weights={"a": 0.02}))
pipe.connect("bm25.documents", "rerank.documents")
query = "How do plants turn light into energy?"
for doc in pipe.run({"bm25": {"query": query}, "rerank": {"query": query}})["rerank"]["documents"]:
    why = doc.meta["normrank"]  # score, cosine, norm_feature, weight, norm, retrieval_score
    print(f"{doc.score:.3f} (cos {why['cosine']:.3f}, bm25 {why['retrieval_score']:.2f})  {doc.content}")
