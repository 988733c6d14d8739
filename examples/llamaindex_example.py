from llama_index.core import Document, VectorStoreIndex
from llama_index.core.llms import MockLLM
from llama_index.embeddings.normrank import NormRankEmbedding
from llama_index.postprocessor.normrank import NormRankPostprocessor

texts = [
    "The Eiffel Tower is a wrought-iron lattice tower in Paris.",
    "Photosynthesis turns light, water and carbon dioxide into sugar in green plants.",
    "The Great Wall of China stretches across northern China.",
    "Mitochondria produce most of the chemical energy a cell needs.",
]
embed = NormRankEmbedding()  # raw vectors: same ranking as the stock model, norm kept
index = VectorStoreIndex.from_documents([Document(text=t) for t in texts], embed_model=embed)
rerank = NormRankPostprocessor(encoder=embed.encoder, top_n=2, weights={"a": 0.02})
engine = index.as_query_engine(llm=MockLLM(), similarity_top_k=4, node_postprocessors=[rerank])
for hit in engine.query("How do plants turn light into energy?").source_nodes:
    print(f"{hit.score:.3f} (cos {hit.node.metadata['cosine']:.3f})  {hit.node.text}")
